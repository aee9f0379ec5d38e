/* cpuset.h - binding workers and replica threads to shares of the CPUs they may use.
 *
 * On the cpu device, N workers of a node (or N DP replica threads) each get an equal, disjoint
 * share of the CPUs the process may use (its affinity mask: what Slurm's cgroup, taskset or
 * numactl allowed), with the hardware threads of one core kept in one share. Unbound, the
 * scheduler moves workers and their comm threads between CPUs, two of them share one CPU for a
 * while, and in synchronous data parallelism that one slow rank holds up every rank at the next
 * all-reduce.
 *
 * On GPU nodes each worker is bound instead to CPUs near its GPU: the CPUs sysfs lists as local
 * to the GPU's PCI device (its NUMA node), shared out among the workers whose GPUs have the same
 * local CPUs. A worker on the far socket pays for every kernel launch, every pinned-memory copy
 * and every NCCL proxy step with a trip across the socket link.
 */
#ifndef DT_CPUSET_H
#define DT_CPUSET_H

#include <sched.h>
#include <stddef.h>

#include "common/err.h"

/* The CPUs the calling thread may run on. */
int dt_cpuset_current(cpu_set_t *set, dt_err *err);

/* out = share `index` of `count` of base: the CPUs of base ordered by (package, core, CPU
 * number), so that the hardware threads of a core are neighbours, cut into `count` contiguous
 * pieces whose sizes differ by at most one. -ERANGE (out untouched) when base has fewer CPUs
 * than count or index is not in [0, count). */
int dt_cpuset_share(const cpu_set_t *base, int index, int count, cpu_set_t *out, dt_err *err);

/* Binds the calling thread, and the threads it creates afterwards, to set. */
int dt_cpuset_bind(const cpu_set_t *set, dt_err *err);

/* The CPUs of set as a list: "0-3,8,10-11" ("" when empty). */
void dt_cpuset_format(const cpu_set_t *set, char *buf, size_t cap);

/* Parses a CPU list as the kernel writes it ("0-27,56-83\n"; "" is the empty set). -EINVAL
 * names the first bad character. */
int dt_cpuset_parse(const char *list, cpu_set_t *out, dt_err *err);

/* The CPUs local to PCI device `bus_id` ("0000:3B:00.0", the form cudaDeviceGetPCIBusId gives;
 * an 8-digit domain and either case are accepted): <sysfs>/bus/pci/devices/<id>/local_cpulist,
 * sysfs being "/sys" outside tests. -ENOENT when sysfs does not list it, -EINVAL for a malformed
 * id; an empty list (no NUMA information) is -ENODATA. */
int dt_cpuset_pci_local(const char *sysfs, const char *bus_id, cpu_set_t *out, dt_err *err);

/* Worker `me`'s CPUs when near[k] are the CPUs near worker k's device (k in [0, n)): within
 * base, the CPUs near its own device, cut into shares (as dt_cpuset_share) among the workers
 * whose devices have the same CPUs near them, in worker order; the whole of them, shared, when
 * those workers outnumber the CPUs. -ENOENT (out untouched) when base has none of the CPUs near
 * its device (a cgroup that excludes that NUMA node). */
int dt_cpuset_near_share(const cpu_set_t *base, const cpu_set_t *near, int n, int me,
                         cpu_set_t *out, dt_err *err);

#endif
