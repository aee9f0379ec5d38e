/* cpuset.h - binding workers and replica threads to shares of the CPUs they may use.
 *
 * On the cpu device, N workers of a node (or N DP replica threads) each get an equal, disjoint
 * share of the CPUs the process may use (its affinity mask: what Slurm's cgroup, taskset or
 * numactl allowed), with the hardware threads of one core kept in one share. Unbound, the
 * scheduler moves workers and their comm threads between CPUs, two of them share one CPU for a
 * while, and in synchronous data parallelism that one slow rank holds up every rank at the next
 * all-reduce.
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

#endif
