/* A tiny TAP writer for multi-rank test programs: every rank runs every check, the verdict of
 * each check is the logical AND over ranks (so any rank failing fails it), rank 0 prints it.
 * Collective: every rank calls tap_check for the same checks in the same order.
 *
 *     tap_init();                          // after dt_init (uses the runtime's clients)
 *     tap_check(ok, "read matches %s", what);
 *     return tap_done();                  // prints the plan; exit status 1 if any failed
 */
#ifndef DT_TEST_TAP_H
#define DT_TEST_TAP_H

#include <stdbool.h>

void tap_init(void);
/* Record one check; `ok` is this rank's verdict. Returns the combined verdict. */
bool tap_check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print a diagnostic line ("# ...") from rank 0 only. */
void tap_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print the plan, return the process exit status. */
int tap_done(void);

#endif
