/* cpuset.c - see cpuset.h. */
#include "common/cpuset.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_key {
    int pkg, core, cpu;
} cpu_key;

static int read_topology(int cpu, const char *what)
{
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, what);
    FILE *f = fopen(path, "re");
    int v = -1;
    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int cmp_key(const void *a, const void *b)
{
    const cpu_key *x = a, *y = b;
    if (x->pkg != y->pkg)
        return x->pkg < y->pkg ? -1 : 1;
    if (x->core != y->core)
        return x->core < y->core ? -1 : 1;
    return (x->cpu > y->cpu) - (x->cpu < y->cpu);
}

int dt_cpuset_current(cpu_set_t *set, dt_err *err)
{
    CPU_ZERO(set);
    if (sched_getaffinity(0, sizeof *set, set) != 0)
        return dt_err_errno(err, errno, "sched_getaffinity");
    return 0;
}

int dt_cpuset_share(const cpu_set_t *base, int index, int count, cpu_set_t *out, dt_err *err)
{
    int n = CPU_COUNT(base);
    if (count < 1 || index < 0 || index >= count || n < count)
        return dt_err_set(err, -ERANGE, "cannot give share %d of %d of %d CPU(s)", index, count,
                          n);
    cpu_key keys[CPU_SETSIZE];
    int k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < n; c++) {
        if (!CPU_ISSET(c, base))
            continue;
        /* Without sysfs (or for an odd CPU), the CPU number alone orders it. */
        int pkg = read_topology(c, "physical_package_id"), core = read_topology(c, "core_id");
        keys[k++] = (cpu_key){pkg < 0 ? 0 : pkg, core < 0 ? c : core, c};
    }
    qsort(keys, (size_t)k, sizeof *keys, cmp_key);
    int lo = (int)((long)index * k / count), hi = (int)((long)(index + 1) * k / count);
    CPU_ZERO(out);
    for (int i = lo; i < hi; i++)
        CPU_SET(keys[i].cpu, out);
    return 0;
}

int dt_cpuset_bind(const cpu_set_t *set, dt_err *err)
{
    if (sched_setaffinity(0, sizeof *set, set) != 0) {
        char list[256];
        dt_cpuset_format(set, list, sizeof list);
        return dt_err_errno(err, errno, "sched_setaffinity to CPUs %s", list);
    }
    return 0;
}

void dt_cpuset_format(const cpu_set_t *set, char *buf, size_t cap)
{
    size_t len = 0;
    if (cap)
        buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
            e++;
        int w = e > c ? snprintf(buf + len, cap - len, "%s%d-%d", len ? "," : "", c, e)
                      : snprintf(buf + len, cap - len, "%s%d", len ? "," : "", c);
        if (w < 0 || (size_t)w >= cap - len)
            return; /* truncated */
        len += (size_t)w;
        c = e;
    }
}

int dt_cpuset_parse(const char *list, cpu_set_t *out, dt_err *err)
{
    CPU_ZERO(out);
    const char *p = list;
    while (*p && *p != '\n') {
        char *end;
        long lo = strtol(p, &end, 10), hi = lo;
        if (end == p || !isdigit((unsigned char)*p))
            goto bad;
        p = end;
        if (*p == '-') {
            const char *q = p + 1;
            hi = strtol(q, &end, 10);
            if (end == q || !isdigit((unsigned char)*q))
                goto bad;
            p = end;
        }
        if (lo > hi || hi >= CPU_SETSIZE)
            return dt_err_set(err, -EINVAL, "CPU list \"%s\": range %ld-%ld is out of order or "
                                            "past CPU %d", list, lo, hi, CPU_SETSIZE - 1);
        for (long c = lo; c <= hi; c++)
            CPU_SET((int)c, out);
        if (*p == ',')
            p++;
        else if (*p && *p != '\n')
            goto bad;
    }
    return 0;
bad:
    return dt_err_set(err, -EINVAL, "CPU list \"%s\": unexpected '%c' at offset %d", list,
                      *p ? *p : '?', (int)(p - list));
}

int dt_cpuset_pci_local(const char *sysfs, const char *bus_id, cpu_set_t *out, dt_err *err)
{
    unsigned dom, bus, dev, fn;
    int end = -1;
    if (sscanf(bus_id, "%8x:%2x:%2x.%1x%n", &dom, &bus, &dev, &fn, &end) != 4 || end < 0 ||
        bus_id[end] != '\0')
        return dt_err_set(err, -EINVAL, "PCI bus id \"%s\" is not domain:bus:device.function",
                          bus_id);
    char path[512], list[4096];
    snprintf(path, sizeof path, "%s/bus/pci/devices/%04x:%02x:%02x.%x/local_cpulist", sysfs, dom,
             bus, dev, fn);
    FILE *f = fopen(path, "re");
    if (!f)
        return dt_err_errno(err, errno, "%s", path);
    size_t n = fread(list, 1, sizeof list - 1, f);
    fclose(f);
    list[n] = '\0';
    int rc = dt_cpuset_parse(list, out, err);
    if (rc)
        return dt_err_prefix(err, "%s: ", path);
    if (CPU_COUNT(out) == 0)
        return dt_err_set(err, -ENODATA, "%s lists no CPUs", path);
    return 0;
}

int dt_cpuset_near_share(const cpu_set_t *base, const cpu_set_t *near, int n, int me,
                         cpu_set_t *out, dt_err *err)
{
    cpu_set_t mine, other;
    CPU_AND(&mine, base, &near[me]);
    if (CPU_COUNT(&mine) == 0)
        return dt_err_set(err, -ENOENT, "none of the CPUs near device %d may be used here", me);
    int index = 0, count = 0;
    for (int k = 0; k < n; k++) {
        CPU_AND(&other, base, &near[k]);
        if (CPU_EQUAL(&other, &mine)) {
            index += k < me;
            count++;
        }
    }
    if (count > CPU_COUNT(&mine)) {
        *out = mine;
        return 0;
    }
    return dt_cpuset_share(&mine, index, count, out, err);
}
