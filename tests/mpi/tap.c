/* TAP output for multi-rank tests; verdicts combined over the runtime's clients. */
#include "tap.h"

#include "dt.h"

#include <stdarg.h>
#include <stdio.h>

static int tests, failures;

void tap_init(void)
{
    tests = failures = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
}

bool tap_check(bool ok, const char *fmt, ...)
{
    /* AND over clients, through the library's own yielding gather (blocking MPI spins). */
    int mine = ok ? 1 : 0, n = dt_num_clients();
    int all[4096];
    bool every = ok;
    if (dt__rt.world != MPI_COMM_NULL && n <= 4096 &&
        dt__allgather_bytes(dt__rt.world, &mine, sizeof mine, all) == DT_OK)
        for (int c = 0; c < n; c++)
            every = every && all[c];
    tests++;
    if (!every)
        failures++;
    if (dt_client_id() == 0) {
        va_list ap;
        va_start(ap, fmt);
        printf("%s %d - ", every ? "ok" : "not ok", tests);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        if (!every && dt__rt.world != MPI_COMM_NULL)
            for (int c = 0; c < n; c++)
                if (!all[c])
                    printf("#   failed on client %d\n", c);
    }
    if (!ok)
        fprintf(stderr, "# client %d: check %d failed; last error: %s\n", dt_client_id(), tests,
                dt_last_error());
    return every;
}

void tap_diag(const char *fmt, ...)
{
    if (dt_client_id() != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

int tap_done(void)
{
    if (dt_client_id() == 0)
        printf("1..%d\n", tests);
    return failures ? 1 : 0;
}
