// plot.c: SVG line charts (see plot.h). Axes with "nice" ticks, one polyline per
// series, a legend; panels stacked vertically. Plain text output, no libraries.
#include "io/plot.h"

#include <math.h>

#include "core/common.h"
#include "io/safetensors.h"

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

__attribute__((format(printf, 2, 3))) static void bprintf(Buf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->n) {
            b->n += k;
            return;
        }
        b->cap = b->cap * 2 + 4096;
        b->s = (char *)reallocCheck(b->s, b->cap);
    }
}

// tick spacing of 1, 2 or 5 times a power of ten giving about `want` ticks
static double nice_step(double range, int want) {
    double raw = range / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

void plot_svg(const char *path, const PlotPanel *panels, int npanels) {
    const int W = 720, PH = 260, ML = 70, MR = 150, MT = 34, MB = 44;
    Buf b = {0};
    b.cap = 1 << 14;
    b.s = (char *)mallocCheck(b.cap);
    bprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W,
            PH * npanels);
    bprintf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    for (int p = 0; p < npanels; p++) {
        const PlotPanel *pn = &panels[p];
        double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
        for (int s = 0; s < pn->nseries; s++)
            for (int i = 0; i < pn->series[s].n; i++) {
                double x = pn->series[s].x[i], y = pn->series[s].y[i];
                if (!isfinite(x) || !isfinite(y)) continue;
                x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
            }
        if (!isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
        if (x1 <= x0) x1 = x0 + 1;
        if (y1 <= y0) y1 = y0 + 1;
        double ys = nice_step(y1 - y0, 5), xs = nice_step(x1 - x0, 8);
        y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
        int top = p * PH + MT, h = PH - MT - MB, w = W - ML - MR;
#define PX(x) (ML + ((x) - x0) / (x1 - x0) * w)
#define PY(y) (top + h - ((y) - y0) / (y1 - y0) * h)
        bprintf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", ML, top - 12, pn->title);
        bprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", ML, top, w, h);
        for (double y = y0; y <= y1 + ys * 1e-9; y += ys) {
            bprintf(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", ML, ML + w, PY(y), PY(y));
            bprintf(&b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ML - 6, PY(y) + 4, fabs(y) < 1e-12 ? 0 : y);
        }
        for (double x = ceil(x0 / xs) * xs; x <= x1 + xs * 1e-9; x += xs)
            bprintf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", PX(x), top + h + 16, x);
        bprintf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", ML + w / 2, top + h + 34, pn->xlabel);
        bprintf(&b, "<text transform=\"translate(%d,%d) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", 16, top + h / 2,
                pn->ylabel);
        for (int s = 0; s < pn->nseries; s++) {
            const PlotSeries *se = &pn->series[s];
            bprintf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"", se->color,
                    se->dashed ? " stroke-dasharray=\"6,4\"" : "");
            for (int i = 0; i < se->n; i++)
                if (isfinite(se->x[i]) && isfinite(se->y[i])) bprintf(&b, "%.1f,%.1f ", PX(se->x[i]), PY(se->y[i]));
            bprintf(&b, "\"/>\n");
            if (se->markers)
                for (int i = 0; i < se->n; i++)
                    if (isfinite(se->x[i]) && isfinite(se->y[i]))
                        bprintf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", PX(se->x[i]), PY(se->y[i]), se->color);
            int ly = top + 14 + 18 * s;
            bprintf(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>", ML + w + 10, ML + w + 34,
                    ly, ly, se->color, se->dashed ? " stroke-dasharray=\"6,4\"" : "");
            bprintf(&b, "<text x=\"%d\" y=\"%d\">%s</text>\n", ML + w + 40, ly + 4, se->name);
        }
#undef PX
#undef PY
    }
    bprintf(&b, "</svg>\n");
    write_file_atomic(path, b.s, b.n);
    free(b.s);
}
