/* core/app/chart.h — an SVG chart of training progress: loss curves (train, test) on the top
 * panel, test accuracy in percent on the middle one, the learning rate on the bottom one;
 * self-contained, opens in a browser. */
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

/* Per logged interval: x (fractional epochs), the training loss and the learning rate; n points. */
typedef struct tt_chart_steps {
  const double *x, *loss, *lr;
  int n;
} tt_chart_steps;

/* tt_chart_svg with the per-interval series too: the training loss as a thin line under the
 * per-epoch losses, the learning rate on a panel of its own. steps may be NULL. Each polyline
 * carries data-series="step_loss" | "train_loss" | "test_loss" | "test_accuracy" | "lr". */
int tt_chart_svg_steps(const char *path, const double *epoch, const double *train_loss, const double *test_loss,
                       const double *test_acc, int n, const tt_chart_steps *steps, const char *title, tt_err *err);

/* Appends s as SVG/XML text: the markup characters escaped, control characters dropped (XML
 * 1.0 forbids most of them). For names the user wrote (a recipe's name, its layers'), so that
 * none can end a text element or inject markup. Shared with plan --svg (plan_svg.c). */
void tt_svg_escape(tt_strbuf *b, const char *s);

#ifdef __cplusplus
}
#endif
#endif
