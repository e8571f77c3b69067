/* Names that messages and the printer share (spmd/graph.c, spmd/program.c, the relayout files
 * and the op rules reach them here, below all of them): the op table (each op's name and its
 * printing hook), the unary and binary operators, layouts as text. */
#include "engine.h"

#include <stdio.h>

/* The op table: one definition per op of DT__OP_LIST, each in spmd/ops/<op>.c. */
static const dt__op_def *const op_table[DT__OP_COUNT] = {
#define DT__OP_ENTRY(NAME, name) [DT__OP_##NAME] = &dt__op_##name,
    DT__OP_LIST(DT__OP_ENTRY)
#undef DT__OP_ENTRY
};

const dt__op_def *dt__op_get(dt__op op)
{
    return (unsigned)op < DT__OP_COUNT ? op_table[op] : NULL;
}

const char *dt_unary_op_name(dt_unary_op op)
{
    static const char *const names[] = {
#define UNAME(NAME, name) [DT_UNARY_##NAME] = #name,
        DT_UNARY_LIST(UNAME)
#undef UNAME
    };
    return (unsigned)op < DT_UNARY_COUNT ? names[op] : "?";
}

const char *dt_binary_op_name(dt_binary_op op)
{
    static const char *const names[] = {
#define BNAME(NAME, name) [DT_BINARY_##NAME] = #name,
        DT_BINARY_LIST(BNAME)
#undef BNAME
    };
    return (unsigned)op < DT_BINARY_COUNT ? names[op] : "?";
}

char *dt__layout_str(const dt_layout *l, char *buf, size_t size)
{
    if (dt_layout_to_string(l, buf, size) != DT_OK)
        snprintf(buf, size, "<invalid layout>");
    return buf;
}
