/* nvml.c - GPU telemetry: NVML loaded at run time, sampled on a side thread.
 *
 * NVML is opened with dlopen so that one binary runs on machines with and without an
 * NVIDIA driver; where it is missing we say so once per process, in one plain line
 * ("GPU telemetry: none, no NVIDIA driver"), and carry on. The
 * sampler reads SM and memory clocks, power, temperature and the clock-event (throttle)
 * reasons of every device at 10-100 Hz and records them as counters of the trace's GPU
 * process, on the spans' clock (st_prof_now_ns). It also keeps, for device 0, the sums a
 * step summary needs: how much SM frequency was lost against the maximum clock.
 *
 * The NVML declarations are written out here (the ABI is stable and C); no header needed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata/prof.h"

typedef int nvml_ret;
typedef struct nvml_dev_s *nvml_dev;
enum { NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_TEMPERATURE_GPU = 0 };
#define NVML_REASON_GPU_IDLE 0x1ull
#define MAX_GPUS 8

typedef struct nvml_api {
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    const char *(*error_string)(nvml_ret);
    nvml_ret (*count)(unsigned *);
    nvml_ret (*handle)(unsigned, nvml_dev *);
    nvml_ret (*name)(nvml_dev, char *, unsigned);
    nvml_ret (*clock)(nvml_dev, int, unsigned *);
    nvml_ret (*max_clock)(nvml_dev, int, unsigned *);
    nvml_ret (*power)(nvml_dev, unsigned *); /* milliwatts */
    nvml_ret (*temperature)(nvml_dev, int, unsigned *);
    nvml_ret (*reasons)(nvml_dev, unsigned long long *);
} nvml_api;

typedef struct gpu_tracks {
    char sm[48], mem[48], power[48], temp[48], reasons[64];
} gpu_tracks;

struct st_prof_gpu {
    void *lib;
    nvml_api api;
    int n;
    nvml_dev dev[MAX_GPUS];
    unsigned max_sm[MAX_GPUS];
    gpu_tracks tracks[MAX_GPUS]; /* counter names: they must outlive the trace's drain */
    double period_s;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    /* device 0, since the last summary */
    double sm_sum;
    int samples;
    unsigned long long reasons_or;
};

static int g_said_no_gpu;

/* Said once per process, as one plain line: a machine without a GPU is normal, not an
 * error. NOTE is the short reason ("no NVIDIA driver"); the full one (the loader's
 * message) goes to err and, at log level 2, to stderr. */
static st_status no_gpu(st_err *err, const char *note, const char *fmt, const char *detail) {
    char full[512];
    snprintf(full, sizeof full, fmt, detail);
    st_errf(err, ST_ERR_UNSUPPORTED, "%s", full);
    if (!g_said_no_gpu) {
        g_said_no_gpu = 1;
        st_log(1, "GPU telemetry: none, %s\n", note);
        st_log(2, "strata: GPU telemetry: %s\n", full);
    }
    return ST_ERR_UNSUPPORTED;
}

static void sample_once(st_prof_gpu *g) {
    for (int i = 0; i < g->n; i++) {
        unsigned sm = 0, mem = 0, mw = 0, temp = 0;
        unsigned long long why = 0;
        int ok_sm = g->api.clock(g->dev[i], NVML_CLOCK_SM, &sm) == 0;
        if (ok_sm) st_prof_counter_gpu(g->tracks[i].sm, sm);
        if (g->api.clock(g->dev[i], NVML_CLOCK_MEM, &mem) == 0) st_prof_counter_gpu(g->tracks[i].mem, mem);
        if (g->api.power && g->api.power(g->dev[i], &mw) == 0) st_prof_counter_gpu(g->tracks[i].power, mw * 1e-3);
        if (g->api.temperature && g->api.temperature(g->dev[i], NVML_TEMPERATURE_GPU, &temp) == 0)
            st_prof_counter_gpu(g->tracks[i].temp, temp);
        int ok_why = g->api.reasons && g->api.reasons(g->dev[i], &why) == 0;
        if (ok_why) st_prof_counter_gpu(g->tracks[i].reasons, (double)why);
        if (i == 0 && ok_sm) {
            pthread_mutex_lock(&g->mu);
            g->sm_sum += sm;
            g->samples++;
            if (ok_why) g->reasons_or |= why;
            pthread_mutex_unlock(&g->mu);
        }
    }
}

static void *sampler_main(void *arg) {
    st_prof_gpu *g = arg;
    st_prof_thread_name("nvml sampler");
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        pthread_mutex_unlock(&g->mu);
        sample_once(g);
        pthread_mutex_lock(&g->mu);
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        long ns = (long)(g->period_s * 1e9);
        dl.tv_sec += ns / 1000000000L;
        dl.tv_nsec += ns % 1000000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        if (!g->stop) pthread_cond_timedwait(&g->cv, &g->mu, &dl);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

#define SYM(field, name, required)                                                            \
    do {                                                                                      \
        *(void **)&g->api.field = dlsym(g->lib, name);                                        \
        if (!g->api.field && (required)) missing = name;                                      \
    } while (0)

st_status st_prof_gpu_open(st_prof_gpu **out, double hz, st_err *err) {
    *out = NULL;
    if (hz <= 0) hz = 20;
    if (hz < 10) hz = 10;
    if (hz > 100) hz = 100;
    const char *path = getenv("STRATA_NVML_LIB");
    if (!path || !path[0]) path = "libnvidia-ml.so.1";
    st_prof_gpu *g = calloc(1, sizeof *g);
    if (!g) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    g->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g->lib) {
        const char *why = dlerror();
        free(g);
        return no_gpu(err, "no NVIDIA driver", "cannot load NVML (%s); GPU counters are off", why ? why : path);
    }
    const char *missing = NULL;
    SYM(init, "nvmlInit_v2", 1);
    SYM(shutdown, "nvmlShutdown", 1);
    SYM(error_string, "nvmlErrorString", 1);
    SYM(count, "nvmlDeviceGetCount_v2", 1);
    SYM(handle, "nvmlDeviceGetHandleByIndex_v2", 1);
    SYM(name, "nvmlDeviceGetName", 0);
    SYM(clock, "nvmlDeviceGetClockInfo", 1);
    SYM(max_clock, "nvmlDeviceGetMaxClockInfo", 1);
    SYM(power, "nvmlDeviceGetPowerUsage", 0);
    SYM(temperature, "nvmlDeviceGetTemperature", 0);
    SYM(reasons, "nvmlDeviceGetCurrentClocksEventReasons", 0);
    if (!g->api.reasons) SYM(reasons, "nvmlDeviceGetCurrentClocksThrottleReasons", 0);
    if (missing) {
        dlclose(g->lib);
        free(g);
        return no_gpu(err, "the NVIDIA driver is too old", "NVML lacks %s (driver too old?); GPU counters are off", missing);
    }
    nvml_ret r = g->api.init();
    if (r != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s (code %d)", g->api.error_string(r), r);
        dlclose(g->lib);
        free(g);
        return no_gpu(err, "the NVIDIA driver cannot start", "NVML cannot start: %s; GPU counters are off", why);
    }
    unsigned n = 0;
    if (g->api.count(&n) != 0 || n == 0) {
        g->api.shutdown();
        dlclose(g->lib);
        free(g);
        return no_gpu(err, "no NVIDIA GPU", "%s", "NVML sees no GPU; GPU counters are off");
    }
    g->n = n > MAX_GPUS ? MAX_GPUS : (int)n;
    for (int i = 0; i < g->n; i++) {
        if (g->api.handle((unsigned)i, &g->dev[i]) != 0) {
            g->n = i;
            break;
        }
        if (g->api.max_clock(g->dev[i], NVML_CLOCK_SM, &g->max_sm[i]) != 0) g->max_sm[i] = 0;
        gpu_tracks *t = &g->tracks[i];
        snprintf(t->sm, sizeof t->sm, "gpu%d SM clock (MHz)", i);
        snprintf(t->mem, sizeof t->mem, "gpu%d memory clock (MHz)", i);
        snprintf(t->power, sizeof t->power, "gpu%d power (W)", i);
        snprintf(t->temp, sizeof t->temp, "gpu%d temperature (C)", i);
        snprintf(t->reasons, sizeof t->reasons, "gpu%d clock-event reasons (bitmask)", i);
        char name[96] = "?";
        if (g->api.name) g->api.name(g->dev[i], name, sizeof name);
        st_log(2, "strata: GPU %d: %s, max SM clock %u MHz, sampled at %.0f Hz\n", i, name, g->max_sm[i], hz);
    }
    if (g->n == 0) {
        g->api.shutdown();
        dlclose(g->lib);
        free(g);
        return no_gpu(err, "no NVIDIA GPU", "%s", "NVML gives no device handle; GPU counters are off");
    }
    g->period_s = 1.0 / hz;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thr, NULL, sampler_main, g) != 0) {
        g->api.shutdown();
        dlclose(g->lib);
        free(g);
        return st_errf(err, ST_ERR_INVALID, "cannot start the NVML sampler thread");
    }
    *out = g;
    return ST_OK;
}

int st_prof_gpu_count(const st_prof_gpu *g) { return g ? g->n : 0; }

void st_prof_gpu_take_summary(st_prof_gpu *g, double *freq_lost, uint64_t *reasons, int *samples) {
    *freq_lost = -1, *reasons = 0, *samples = 0;
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    if (g->samples > 0 && g->max_sm[0] > 0) *freq_lost = 1.0 - g->sm_sum / g->samples / g->max_sm[0];
    else *freq_lost = 0;
    *reasons = g->reasons_or;
    *samples = g->samples;
    g->sm_sum = 0, g->samples = 0, g->reasons_or = 0;
    pthread_mutex_unlock(&g->mu);
}

void st_prof_gpu_close(st_prof_gpu *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thr, NULL);
    g->api.shutdown();
    dlclose(g->lib);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}
