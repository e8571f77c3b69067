/* The typed kernels of one dtype (backends/cpu/kernels.c): fill, arange, unary, binary, reduce,
 * transpose, select_fill and where, as static functions named KERNEL_NAME (fill_f32, ...).
 * A template: backends/cpu/kernels.c includes it once per dtype, with CPU_KT defined as that
 * dtype's row (backends/cpu/dtypes.h); it defines its own macros from the row and undefines them
 * and CPU_KT at the end. Being plain functions, not one macro, a compiler error points at its
 * line here. */
#ifndef CPU_KT
#error "kernels_typed.h: define CPU_KT (a row of dtypes.h) before including it"
#endif

#define T_ARG0(a, ...) a
#define T_ARG1(a, b, ...) b
#define T_ARG2(a, b, c, ...) c
#define T_ARG3(a, b, c, d, ...) d
#define T_ARG4(a, b, c, d, e, ...) e
#define T_ARG5(a, b, c, d, e, f, ...) f
#define T_ARG6(a, b, c, d, e, f, g) g
#define T_ROW(F, ...) F(__VA_ARGS__)
#define NAME T_ROW(T_ARG0, CPU_KT)
#define S T_ROW(T_ARG1, CPU_KT)
#define C T_ROW(T_ARG2, CPU_KT)
#define IS_FLOAT T_ROW(T_ARG3, CPU_KT)
#define IS_SIGNED T_ROW(T_ARG4, CPU_KT)
#define LOWEST T_ROW(T_ARG5, CPU_KT)
#define HIGHEST T_ROW(T_ARG6, CPU_KT)
/* NAME's function and element macros: T_FN(fill) is fill_f32, T_LD is LD_f32 ... */
#define T_CAT2(a, b) a##_##b
#define T_CAT(a, b) T_CAT2(a, b)
#define T_FN(f) T_CAT(f, NAME)
#define T_LD T_CAT(LD, NAME)
#define T_ST T_CAT(ST, NAME)
#define T_STD T_CAT(STD, NAME)
#define T_NEG T_CAT(NEG, NAME)
#define T_FLOATS T_CAT(FLOATS, NAME)

static void T_FN(fill)(const dt__kargs *k, const void *const in[], void *out)
{
    (void)in;
    S *o = out, v = T_STD(k->a);
    int64_t n = dt__num_elements(k->rank, k->shape);
    for (int64_t i = 0; i < n; i++)
        o[i] = v;
}
static void T_FN(arange)(const dt__kargs *k, const void *const in[], void *out)
{
    (void)in;
    S *o = out;
    for (int64_t i = 0; i < k->shape[0]; i++)
        o[i] = T_STD(k->a + k->b * (double)(k->offset[0] + i));
}
CPU_VECTOR_CLONES static void T_FN(unary)(const dt__kargs *k, const void *const in[], void *out)
{
    const S *x = in[0];
    S *o = out;
    int64_t n = dt__num_elements(k->rank, k->shape);
    switch ((dt_unary_op)k->op) {
    case DT_UNARY_NEG:
        for (int64_t i = 0; i < n; i++)
            o[i] = T_ST(DT__NEG(T_LD(x[i])));
        break;
    case DT_UNARY_ABS:
        for (int64_t i = 0; i < n; i++) {
            C v = T_LD(x[i]);
            o[i] = T_ST(T_NEG(v) ? DT__NEG(v) : v);
        }
        break;
    case DT_UNARY_RELU:
        for (int64_t i = 0; i < n; i++) {
            C v = T_LD(x[i]);
            o[i] = T_ST(v > 0 ? v : (C)0);
        }
        break;
    case DT_UNARY_SQUARE:
        for (int64_t i = 0; i < n; i++) {
            C v = T_LD(x[i]);
            o[i] = T_ST(DT__MUL(v, v));
        }
        break;
    default:
        if (unary_floats(T_FLOATS, k->op, x, o, n))
            break;
        for (int64_t i = 0; i < n; i++)
            o[i] = T_STD(dt__unary_f(k->op, (double)T_LD(x[i])));
    }
}
/* numpy's divmod: the quotient rounded towards minus infinity and the remainder with the
 * divisor's sign; floats through the exact fmod (as npy_divmod), so that 1 // 0.1 is 9;
 * an integer divisor of 0 gives 0 and 0 (as the integer DIV)
 */
static C T_FN(floor_divmod)(C a, C b, C *mod)
{
    if (!IS_FLOAT && b == 0) {
        *mod = 0;
        return 0;
    }
    if (!IS_FLOAT) {
        C q = IS_SIGNED && b == (C)-1 ? DT__NEG(a) : (C)(a / b);
        C r = DT__SUB(a, DT__MUL(q, b));
        bool fix = r != 0 && T_NEG(r) != T_NEG(b);
        *mod = fix ? DT__ADD(r, b) : r;
        return fix ? DT__SUB(q, (C)1) : q;
    }
    C m = (C)fmod((double)a, (double)b);
    if (b == 0) {
        *mod = m;
        return (C)(a / b);
    }
    C div = (C)((a - m) / b);
    if (m != 0 && T_NEG(b) != T_NEG(m)) {
        m = (C)(m + b);
        div = (C)(div - (C)1);
    }
    *mod = m != 0 ? m : (C)copysign(0.0, (double)b);
    if (div == 0)
        return (C)copysign(0.0, (double)(a / b));
    C fl = (C)floor((double)div);
    return div - fl > (C)0.5 ? (C)(fl + (C)1) : fl;
}
/* max and min as numpy's: a NaN wins (once the running value is NaN it stays so) */
static C T_FN(reduce_one)(int op, C acc, C v)
{
    bool nan = IS_FLOAT && isnan((double)v);
    return op == DT_REDUCE_MAX    ? (v > acc || nan ? v : acc)
           : op == DT_REDUCE_MIN  ? (v < acc || nan ? v : acc)
           : op == DT_REDUCE_PROD ? DT__MUL(acc, v)
                                  : DT__ADD(acc, v);
}
/* One binary op in C (pow aside); comparisons and logical ops give 0 or 1. */
static C T_FN(binary_one)(int op, C a, C b)
{
    switch ((dt_binary_op)op) {
    case DT_BINARY_ADD:
        return DT__ADD(a, b);
    case DT_BINARY_SUB:
        return DT__SUB(a, b);
    case DT_BINARY_MUL:
        return DT__MUL(a, b);
    case DT_BINARY_DIV:
        return IS_FLOAT                  ? (C)(a / b)
               : b == 0                  ? (C)0
               : IS_SIGNED && b == (C)-1 ? DT__NEG(a)
                                         : (C)(a / b);
    case DT_BINARY_MAX: /* numpy's maximum and minimum: a NaN operand gives NaN */
        return a > b || (IS_FLOAT && isnan((double)a)) ? a : b;
    case DT_BINARY_MIN:
        return a < b || (IS_FLOAT && isnan((double)a)) ? a : b;
    case DT_BINARY_EQ:
        return (C)(a == b);
    case DT_BINARY_NE:
        return (C)(a != b);
    case DT_BINARY_LT:
        return (C)(a < b);
    case DT_BINARY_LE:
        return (C)(a <= b);
    case DT_BINARY_GT:
        return (C)(a > b);
    case DT_BINARY_GE:
        return (C)(a >= b);
    case DT_BINARY_FLOORDIV:
    case DT_BINARY_FLOORMOD: {
        C mod, div = T_FN(floor_divmod)(a, b, &mod);
        return op == DT_BINARY_FLOORDIV ? div : mod;
    }
    case DT_BINARY_LOGICAL_AND:
        return (C)(a != 0 && b != 0);
    case DT_BINARY_LOGICAL_OR:
        return (C)(a != 0 || b != 0);
    case DT_BINARY_LOGICAL_XOR:
        return (C)((a != 0) != (b != 0));
    default:
        return a;
    }
}
/* element i of the result: comparisons write bool (one byte per element), the rest the
 * operands' dtype; pow is computed in double and rounded once */
static inline void T_FN(binary_put)(int op, void *out, int64_t i, C a, C b)
{
    if (op == DT_BINARY_POW)
        ((S *)out)[i] = T_STD(pow((double)a, (double)b));
    else if (DT__BINARY_IS_COMPARISON(op))
        ((uint8_t *)out)[i] = (uint8_t)(T_FN(binary_one)(op, a, b) != 0);
    else
        ((S *)out)[i] = T_ST(T_FN(binary_one)(op, a, b));
}
/* The loops of T_FN(binary) for one op: inlined where op is a constant, so that the switch
 * of binary_one folds away and the loops vectorize. Rows of the last axis, along which each
 * operand steps by one element or repeats one (broadcast). */
static inline __attribute__((always_inline)) void
T_FN(binary_loops)(int op, const dt__kargs *k, const S *a, const S *b, void *out)
{
    int r = k->rank;
    int64_t n = dt__num_elements(r, k->shape);
    if (IS_FLOAT && sizeof(S) == 2 && same_shapes(k, 2) && op != DT_BINARY_POW &&
        !DT__BINARY_IS_COMPARISON(op)) {
        /* the 16-bit floats a block at a time: widened, computed and rounded in three
         * loops the compiler vectorizes (the same operations as element by element) */
        C wa[FLOAT_BLOCK], wb[FLOAT_BLOCK];
        S *o = out;
        for (int64_t at = 0; at < n; at += FLOAT_BLOCK) {
            int64_t m = n - at < FLOAT_BLOCK ? n - at : FLOAT_BLOCK;
            for (int64_t j = 0; j < m; j++) {
                wa[j] = T_LD(a[at + j]);
                wb[j] = T_LD(b[at + j]);
            }
            for (int64_t j = 0; j < m; j++)
                wa[j] = T_FN(binary_one)(op, wa[j], wb[j]);
            for (int64_t j = 0; j < m; j++)
                o[at + j] = T_ST(wa[j]);
        }
        return;
    }
    if (same_shapes(k, 2)) {
        for (int64_t i = 0; i < n; i++)
            T_FN(binary_put)(op, out, i, T_LD(a[i]), T_LD(b[i]));
        return;
    }
    int64_t sa[DT_MAX_RANK], sb[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    bcast_strides(r, k->in_shape[0], sa);
    bcast_strides(r, k->in_shape[1], sb);
    int64_t inner = r ? k->shape[r - 1] : 1;
    bool va = r && sa[r - 1], vb = r && sb[r - 1];
    for (int64_t o = 0; inner > 0 && o < n; o += inner) {
        const S *pa = a + offset_of(r - 1, idx, sa), *pb = b + offset_of(r - 1, idx, sb);
        if (va && vb)
            for (int64_t j = 0; j < inner; j++)
                T_FN(binary_put)(op, out, o + j, T_LD(pa[j]), T_LD(pb[j]));
        else if (va)
            for (int64_t j = 0; j < inner; j++)
                T_FN(binary_put)(op, out, o + j, T_LD(pa[j]), T_LD(pb[0]));
        else
            for (int64_t j = 0; j < inner; j++)
                T_FN(binary_put)(op, out, o + j, T_LD(pa[0]), T_LD(pb[vb ? j : 0]));
        next_index(r - 1, k->shape, idx);
    }
}
CPU_VECTOR_CLONES static void T_FN(binary)(const dt__kargs *k, const void *const in[], void *out)
{
    const S *a = in[0], *b = in[1];
    switch ((dt_binary_op)k->op) {
    case DT_BINARY_ADD:
        T_FN(binary_loops)(DT_BINARY_ADD, k, a, b, out);
        break;
    case DT_BINARY_SUB:
        T_FN(binary_loops)(DT_BINARY_SUB, k, a, b, out);
        break;
    case DT_BINARY_MUL:
        T_FN(binary_loops)(DT_BINARY_MUL, k, a, b, out);
        break;
    case DT_BINARY_DIV:
        T_FN(binary_loops)(DT_BINARY_DIV, k, a, b, out);
        break;
    default:
        T_FN(binary_loops)(k->op, k, a, b, out);
        break;
    }
}
/* out has in's rank with reduced axes (k->mask) of extent 1. Each output adds its inputs
 * in input order, in C; the 16-bit floats accumulate in f32 per output (output-major)
 * and round once. k->lda (a run of reduced axes followed by kept ones): the input's stride
 * between reduced elements when the kept columns are a chunk of wider rows (0: packed). */
CPU_VECTOR_CLONES static void T_FN(reduce)(const dt__kargs *k, const void *const in[], void *out)
{
    const S *x = in[0];
    S *o = out;
    int r = k->rank;
    int64_t no = dt__num_elements(r, k->shape), ni = dt__num_elements(r, k->in_shape[0]);
    C init = k->op == DT_REDUCE_MAX    ? LOWEST
             : k->op == DT_REDUCE_MIN  ? HIGHEST
             : k->op == DT_REDUCE_PROD ? (C)1
                                       : (C)0;
    int64_t rows, per_row, inner;
    if (row_view(r, k->in_shape[0], k->mask, &rows, &per_row, &inner) && inner == 1 && !k->lda) {
        /* rows reduced over their contiguous last axes: the running values in registers
         * (accumulating in memory chains every element through one address, many times
         * slower), ROW_BLOCK rows at a time so that their independent chains overlap; each
         * row the same operations in the same order as the loops below */
        int64_t q = 0;
        for (; q + ROW_BLOCK <= rows; q += ROW_BLOCK) {
            C acc[ROW_BLOCK];
            const S *xq = x + q * per_row;
            for (int b = 0; b < ROW_BLOCK; b++)
                acc[b] = init;
            if (k->op == DT_REDUCE_SUM || k->op == DT_REDUCE_MEAN)
                for (int64_t j = 0; j < per_row; j++)
                    for (int b = 0; b < ROW_BLOCK; b++)
                        acc[b] = DT__ADD(acc[b], T_LD(xq[b * per_row + j]));
            else
                for (int64_t j = 0; j < per_row; j++)
                    for (int b = 0; b < ROW_BLOCK; b++)
                        acc[b] = T_FN(reduce_one)(k->op, acc[b], T_LD(xq[b * per_row + j]));
            for (int b = 0; b < ROW_BLOCK; b++)
                o[q + b] = k->a != 1.0 ? T_STD((double)acc[b] * k->a) : T_ST(acc[b]);
        }
        for (; q < rows; q++) {
            C acc = init;
            for (int64_t j = 0; j < per_row; j++)
                acc = T_FN(reduce_one)(k->op, acc, T_LD(x[q * per_row + j]));
            o[q] = k->a != 1.0 ? T_STD((double)acc * k->a) : T_ST(acc);
        }
        return;
    }
    if (row_view(r, k->in_shape[0], k->mask, &rows, &per_row, &inner)) {
        /* a run of reduced axes followed by kept ones (a bias's gradient: [B, T, F] summed
         * over B and T): a block of up to REDUCE_BLOCK running values along the kept inner
         * axes, the inputs added in input order as below (the same result, bit for bit), a
         * loop the compiler vectorizes */
        int64_t ld = k->lda ? k->lda : inner;
        for (int64_t q = 0; q < rows; q++)
            for (int64_t j0 = 0; j0 < inner; j0 += REDUCE_BLOCK) {
                int64_t m = inner - j0 < REDUCE_BLOCK ? inner - j0 : REDUCE_BLOCK;
                const S *xs = x + q * per_row * ld + j0;
                S *os = o + q * inner + j0;
                C acc[REDUCE_BLOCK];
                for (int64_t j = 0; j < m; j++)
                    acc[j] = init;
                if (k->op == DT_REDUCE_SUM || k->op == DT_REDUCE_MEAN)
                    for (int64_t p = 0; p < per_row; p++)
                        for (int64_t j = 0; j < m; j++)
                            acc[j] = DT__ADD(acc[j], T_LD(xs[p * ld + j]));
                else
                    for (int64_t p = 0; p < per_row; p++)
                        for (int64_t j = 0; j < m; j++)
                            acc[j] = T_FN(reduce_one)(k->op, acc[j], T_LD(xs[p * ld + j]));
                for (int64_t j = 0; j < m; j++)
                    os[j] = k->a != 1.0 ? T_STD((double)acc[j] * k->a) : T_ST(acc[j]);
            }
        return;
    }
    if (sizeof(C) == sizeof(S)) {
        /* input-major, accumulating in the output: rows of the kept axes after the last
         * reduced one (contiguous in the input and in the output) added whole, a loop the
         * compiler vectorizes; each output still adds its inputs in input order */
        C *acc = out;
        int64_t so[DT_MAX_RANK], idx[DT_MAX_RANK] = {0}, row = 1;
        int lead = r;
        while (lead > 0 && !(k->mask & (1u << (lead - 1))))
            row *= k->in_shape[0][--lead];
        strides_of(r, k->shape, so);
        for (int i = 0; i < r; i++)
            if (k->mask & (1u << i))
                so[i] = 0;
        for (int64_t i = 0; i < no; i++)
            acc[i] = init;
        for (int64_t i = 0; row > 0 && i < ni; i += row) {
            C *ao = acc + offset_of(lead, idx, so);
            const S *xi = x + i;
            if (k->op == DT_REDUCE_SUM || k->op == DT_REDUCE_MEAN)
                for (int64_t j = 0; j < row; j++)
                    ao[j] = DT__ADD(ao[j], T_LD(xi[j]));
            else
                for (int64_t j = 0; j < row; j++)
                    ao[j] = T_FN(reduce_one)(k->op, ao[j], T_LD(xi[j]));
            next_index(lead, k->in_shape[0], idx);
        }
        for (int64_t i = 0; k->a != 1.0 && i < no; i++)
            o[i] = T_STD((double)acc[i] * k->a);
        return;
    }
    int64_t si[DT_MAX_RANK], rext[DT_MAX_RANK], rst[DT_MAX_RANK], oidx[DT_MAX_RANK] = {0};
    int nr = 0;
    strides_of(r, k->in_shape[0], si);
    for (int i = 0; i < r; i++)
        if (k->mask & (1u << i)) {
            rext[nr] = k->in_shape[0][i];
            rst[nr++] = si[i];
        }
    int64_t per = ni && no ? ni / no : 0;
    for (int64_t j = 0; j < no; j++) {
        int64_t base = 0, ridx[DT_MAX_RANK] = {0};
        for (int i = 0; i < r; i++)
            if (!(k->mask & (1u << i)))
                base += oidx[i] * si[i];
        C acc = init;
        for (int64_t q = 0; q < per; q++) {
            acc = T_FN(reduce_one)(k->op, acc, T_LD(x[base + offset_of(nr, ridx, rst)]));
            next_index(nr, rext, ridx);
        }
        o[j] = k->a != 1.0 ? T_STD((double)acc * k->a) : T_ST(acc);
        next_index(r, k->shape, oidx);
    }
}
static void T_FN(transpose)(const dt__kargs *k, const void *const in[], void *out)
{
    transpose_elements(k, in[0], out, sizeof(S));
}
static void T_FN(select_fill)(const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = dt__num_elements(k->rank, k->shape);
    if (k->select) {
        if (n)
            memcpy(out, in[0], (size_t)n * sizeof(S));
        return;
    }
    S *o = out, v = T_STD(k->a);
    for (int64_t i = 0; i < n; i++)
        o[i] = v;
}
/* out[i] = cond[i] ? x[i] : y[i], each operand broadcast to the output */
static void T_FN(where)(const dt__kargs *k, const void *const in[], void *out)
{
    const uint8_t *c = in[0];
    const S *x = in[1], *y = in[2];
    S *o = out;
    int r = k->rank;
    int64_t n = dt__num_elements(r, k->shape);
    if (same_shapes(k, 3)) {
        for (int64_t i = 0; i < n; i++)
            o[i] = c[i] ? x[i] : y[i];
        return;
    }
    int64_t sc[DT_MAX_RANK], sx[DT_MAX_RANK], sy[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    bcast_strides(r, k->in_shape[0], sc);
    bcast_strides(r, k->in_shape[1], sx);
    bcast_strides(r, k->in_shape[2], sy);
    for (int64_t i = 0; i < n; i++) {
        o[i] = c[offset_of(r, idx, sc)] ? x[offset_of(r, idx, sx)] : y[offset_of(r, idx, sy)];
        next_index(r, k->shape, idx);
    }
}

#undef T_FLOATS
#undef T_NEG
#undef T_STD
#undef T_ST
#undef T_LD
#undef T_FN
#undef T_CAT
#undef T_CAT2
#undef HIGHEST
#undef LOWEST
#undef IS_SIGNED
#undef IS_FLOAT
#undef C
#undef S
#undef NAME
#undef T_ROW
#undef T_ARG6
#undef T_ARG5
#undef T_ARG4
#undef T_ARG3
#undef T_ARG2
#undef T_ARG1
#undef T_ARG0
#undef CPU_KT
