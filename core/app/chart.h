/* core/app/chart.h — an SVG chart of training progress: loss curves (train, test) on the top
 * panel and test accuracy in percent on the bottom one; self-contained, opens in a browser. */
#ifndef TT_CHART_H
#define TT_CHART_H
#include "../base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* n points; epoch may be fractional. Any series pointer may be NULL, and any value NaN
 * (missing: the line breaks there). test_acc is a fraction in [0, 1] (if any value is
 * above 1 the series is taken as already in percent). n = 0 draws empty axes saying
 * "no data yet". Written atomically. Returns 0 or -1 (err set). */
int tt_chart_svg(const char *path, const double *epoch, const double *train_loss, const double *test_loss,
                 const double *test_acc, int n, const char *title, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
