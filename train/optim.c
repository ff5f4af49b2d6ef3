// optim.c: the learning-rate schedules, the warm-up from a ratio, gradient clipping (optim.h).
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "train/optim.h"

double lr_schedule(const char *type, double lr, long step, long warmup, long total) {
    int cosine = !strcmp(type, "cosine"), linear = !strcmp(type, "linear");
    if (!cosine && !linear && strcmp(type, "constant")) die("unknown lr_scheduler_type '%s': use linear, cosine or constant", type);
    if (step < warmup) return lr * (double)step / (double)(warmup > 1 ? warmup : 1);
    long span = total - warmup;
    double f = 1.0;
    if (cosine) f = 0.5 * (1.0 + cos(3.14159265358979323846 * (double)(step - warmup) / (double)(span > 1 ? span : 1)));
    if (linear) f = (double)(total - step) / (double)(span > 1 ? span : 1);
    return lr * (f > 0 ? f : 0);
}

long warmup_steps_from_ratio(double ratio, long total) { return (long)ceil(ratio * (double)total); }

double grad_clip_factor(double norm, double max_norm) {
    if (!(max_norm > 0)) return 1.0;
    if (!isfinite(norm)) return NAN;
    double f = max_norm / (norm + 1e-6);
    return f < 1.0 ? f : 1.0;
}
