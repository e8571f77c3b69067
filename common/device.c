/* A device's failure mark, which the runtime's allocator and the backends (a sticky CUDA
 * error, an emulated fault) both set and read. */
#include "dt.h"

#include <stdio.h>

void dt__device_kill(dt__device *d)
{
    int alive = 0;
    if (!atomic_compare_exchange_strong(&d->dead, &alive, 1))
        return;
    snprintf(d->dead_msg, sizeof d->dead_msg, "%s", dt_last_error());
    atomic_store(&d->dead, 2);
}

dt_status dt__device_alive(const dt__device *d)
{
    int k = atomic_load(&d->dead);
    if (!k)
        return DT_OK;
    return dt__fail(DT_ERR_DEVICE, "%s:%d is unusable since an earlier failure: %s",
                    dt_device_type_name(d->type), d->local_index,
                    k == 2 ? d->dead_msg : "(being recorded)");
}
