// plot.h: a dependency-free SVG line chart, for the reward / held-out accuracy /
// KL / length curves that train_grpo writes at the end of a run.
#ifndef PLOT_H
#define PLOT_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;     // legend
    const double *x, *y;  // n points; NaN y values are skipped
    int n;
    const char *color;    // e.g. "#1f77b4"
    int dashed;
    int markers;          // a dot at each point (for sparse series such as evaluations)
} PlotSeries;

typedef struct {
    const char *title, *xlabel, *ylabel;
    const PlotSeries *series;
    int nseries;
} PlotPanel;

// Write panels stacked vertically into one SVG file (atomically). Dies on I/O errors.
void plot_svg(const char *path, const PlotPanel *panels, int npanels);

#ifdef __cplusplus
}
#endif
#endif  // PLOT_H
