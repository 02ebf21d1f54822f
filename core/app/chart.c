/* core/app/chart.c — see chart.h. Plain SVG 1.1 text, no scripts, no external fonts, so the
 * file opens in any browser and can be attached to a report as it is.
 *
 * Three panels share the x axis (epochs, fractional for logged intervals): losses above (the
 * per-epoch curves over the thin per-interval training loss), test accuracy in the middle, the
 * learning rate per logged interval below. Coordinates below are SVG user units (pixels at 100% zoom); data values are
 * mapped into a panel by chart_sx/chart_sy. Non-finite values (a NaN loss, an epoch not yet
 * evaluated) break a line into pieces instead of dragging it to 0 or off the panel. */
#include "chart.h"
#include "../base/fileio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Layout in pixels: a fixed width keeps every run's chart comparable side by side. */
#define CHART_W 760
#define CHART_PANEL_H 260
#define CHART_LEFT 70
#define CHART_RIGHT 150 /* room for the legend */
#define CHART_TOP 50
#define CHART_GAP 60

/* Appends s (NULL: nothing) as SVG/XML text: the four markup characters as entities, control
 * characters dropped (XML 1.0 forbids most of them), other bytes as they are. */
void tt_svg_escape(tt_strbuf *b, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '<': tt_strbuf_printf(b, "&lt;"); break;
    case '>': tt_strbuf_printf(b, "&gt;"); break;
    case '&': tt_strbuf_printf(b, "&amp;"); break;
    case '"': tt_strbuf_printf(b, "&quot;"); break;
    default:
      if ((unsigned char)*s >= 0x20) tt_strbuf_put(b, s, 1);
    }
  }
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) giving about `want` ticks. */
static double chart_step(double lo, double hi, int want) {
  double raw = (hi - lo) / want, mag, f;
  if (!(raw > 0)) return 1;
  mag = pow(10, floor(log10(raw)));
  f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

typedef struct chart_series {
  const double *x, *v; /* n points; x in epochs */
  int n;
  double scale; /* multiplies every value (accuracy fraction -> percent) */
  const char *name, *color, *id; /* id: the data-series attribute, for tools and tests */
  int dashed, thin;  /* thin: a per-interval series, drawn under the per-epoch ones, no markers */
} chart_series;

typedef struct chart_axes {
  double x0, x1, y0, y1; /* data ranges */
  int px, py, pw, ph;    /* panel rectangle in pixels */
} chart_axes;

/* Data -> pixels. SVG's y grows downwards, hence ph - ... in chart_sy. Callers make x1 > x0 and
 * y1 > y0, so neither divides by zero. */
static double chart_sx(const chart_axes *a, double x) { return a->px + (x - a->x0) / (a->x1 - a->x0) * a->pw; }
static double chart_sy(const chart_axes *a, double y) {
  return a->py + a->ph - (y - a->y0) / (a->y1 - a->y0) * a->ph;
}

/* The x range every panel shares: the epochs of all series, at least one unit wide. */
static void chart_xrange(const chart_series *s, int ns, double *x0, double *x1) {
  int any = 0, n = 0;
  *x0 = 0, *x1 = 1;
  for (int k = 0; k < ns; k++)
    for (int i = 0; s[k].x && i < s[k].n; i++)
      if (isfinite(s[k].x[i])) {
        if (!any || s[k].x[i] < *x0) *x0 = s[k].x[i];
        if (!any || s[k].x[i] > *x1) *x1 = s[k].x[i];
        any = 1, n++;
      }
  if (*x1 - *x0 < 1) {
    double mid = (*x0 + *x1) / 2;
    *x0 = any && n == 1 ? mid - 0.5 : *x0;
    *x1 = *x0 + 1;
  }
  if (*x0 > 0 && *x0 < 1) *x0 = 0;
}

/* One panel at vertical offset py over the x range [x0, x1]: frame, grid, ticks, axis labels,
 * one polyline per series and its legend entry. percent: values are percentages, clamped to
 * [0, 100]. */
static void chart_panel(tt_strbuf *b, double x0, double x1, const chart_series *s, int ns, int py, const char *ylabel,
                        int percent) {
  chart_axes a;
  double lo = INFINITY, hi = -INFINITY, step, t;
  int i, k, guard, npts = 0;
  a.px = CHART_LEFT;
  a.py = py;
  a.pw = CHART_W - CHART_LEFT - CHART_RIGHT;
  a.ph = CHART_PANEL_H;
  a.x0 = x0, a.x1 = x1;
  for (k = 0; k < ns; k++)
    for (i = 0; s[k].v && s[k].x && i < s[k].n; i++)
      if (isfinite(s[k].v[i]) && isfinite(s[k].x[i])) {
        double v = s[k].v[i] * s[k].scale;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
  for (k = 0; k < ns; k++) npts += s[k].v ? s[k].n : 0;
  if (!(lo <= hi)) {
    lo = 0;
    hi = percent ? 100 : 1;
  }
  if (!percent && lo > 0) lo = 0; /* losses from zero: the eye reads ratios */
  if (hi - lo < 1e-9) hi = lo + (percent ? 1 : 1e-3 + fabs(lo) * 0.1);
  step = chart_step(lo, hi, 5);
  a.y0 = floor(lo / step) * step;
  a.y1 = ceil(hi / step) * step;
  if (percent) {
    if (a.y0 < 0) a.y0 = 0;
    if (a.y1 > 100) a.y1 = 100;
    if (a.y1 <= a.y0) a.y1 = a.y0 + step;
  }
  tt_strbuf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#444\"/>\n", a.px, a.py,
               a.pw, a.ph);
  /* guard: tick loops accumulate floating-point steps; 50 bounds them whatever the range */
  for (t = a.y0, guard = 0; t <= a.y1 + step * 1e-6 && guard < 50; t += step, guard++) {
    double y = chart_sy(&a, t);
    tt_strbuf_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", a.px, y, a.px + a.pw, y);
    tt_strbuf_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%g%s</text>\n", a.px - 6, y + 4,
                 fabs(t) < step * 1e-6 ? 0.0 : t, percent ? "%" : "");
  }
  step = chart_step(a.x0, a.x1, 8);
  if (step < 1 && a.x1 - a.x0 >= 2) step = 1;
  for (t = ceil(a.x0 / step - 1e-9) * step, guard = 0; t <= a.x1 + step * 1e-6 && guard < 50; t += step, guard++) {
    double x = chart_sx(&a, t);
    tt_strbuf_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#444\"/>\n", x, a.py + a.ph, x,
                 a.py + a.ph + 5);
    tt_strbuf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\">%g</text>\n", x,
                 a.py + a.ph + 18, fabs(t) < step * 1e-6 ? 0.0 : t);
  }
  tt_strbuf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">epoch</text>\n", a.px + a.pw / 2,
               a.py + a.ph + 34);
  tt_strbuf_printf(b,
               "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 %d %d)\">%s</text>\n",
               18, a.py + a.ph / 2, 18, a.py + a.ph / 2, ylabel);
  if (npts == 0)
    tt_strbuf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\" fill=\"#888\">no data yet</text>\n",
                 a.px + a.pw / 2, a.py + a.ph / 2);
  for (k = 0; k < ns; k++) {
    int open = 0, ly = a.py + 16 + 20 * k, lx = a.px + a.pw + 12, n = s[k].n;
    const double *x = s[k].x, *v = s[k].v;
    if (!v || !x) continue;
    for (i = 0; i < n; i++) {
      int ok = isfinite(v[i]) && isfinite(x[i]);
      if (ok) {
        if (!open)
          tt_strbuf_printf(b, "<polyline data-series=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"",
                           s[k].id, s[k].color, s[k].thin ? "1" : "2", s[k].dashed ? " stroke-dasharray=\"6 3\"" : "");
        tt_strbuf_printf(b, "%.1f,%.1f ", chart_sx(&a, x[i]), chart_sy(&a, v[i] * s[k].scale));
        open = 1;
      } else if (open) {
        tt_strbuf_printf(b, "\"/>\n");
        open = 0;
      }
    }
    if (open) tt_strbuf_printf(b, "\"/>\n");
    /* markers only while they stay distinguishable; a long run's line is its own marker */
    if (n <= 60 && !s[k].thin)
      for (i = 0; i < n; i++)
        if (isfinite(v[i]) && isfinite(x[i]))
          tt_strbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", chart_sx(&a, x[i]),
                       chart_sy(&a, v[i] * s[k].scale), s[k].color);
    tt_strbuf_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"%s\"%s/>\n", lx, ly,
                 lx + 24, ly, s[k].color, s[k].thin ? "1" : "2", s[k].dashed ? " stroke-dasharray=\"6 3\"" : "");
    tt_strbuf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"12\">%s</text>\n", lx + 30, ly + 4, s[k].name);
  }
}

/* A series by value, built field by field because designated initialisers are not in the
 * C++ that the nvcc amalgamation compiles this file as. x and v are borrowed: they must
 * outlive the chart's drawing. */
static chart_series chart_ser(const double *x, const double *v, int n, double scale, const char *name, const char *color,
                              const char *id, int dashed, int thin) {
  chart_series c;
  c.x = x, c.v = v, c.n = n, c.scale = scale, c.name = name, c.color = color, c.id = id, c.dashed = dashed, c.thin = thin;
  return c;
}

/* The per-epoch chart without per-interval series (see tt_chart_svg_steps). */
int tt_chart_svg(const char *path, const double *epoch, const double *train_loss, const double *test_loss,
                 const double *test_acc, int n, const char *title, tt_err *err) {
  return tt_chart_svg_steps(path, epoch, train_loss, test_loss, test_acc, n, NULL, title, err);
}

/* Writes the three-panel chart of n epochs (epoch[i] the x of each point; any of the value
 * arrays may be NULL, and NaN entries leave gaps) and of st's logged intervals (may be NULL)
 * to path, atomically. title is escaped. Returns 0, or -1 with err for bad counts, out of
 * memory or a failed write. */
int tt_chart_svg_steps(const char *path, const double *epoch, const double *train_loss, const double *test_loss,
                       const double *test_acc, int n, const tt_chart_steps *st, const char *title, tt_err *err) {
  tt_strbuf b;
  chart_series loss[3], acc[1], lr[1], all[5];
  int i, nst = st && st->x ? st->n : 0;
  int height = CHART_TOP + 3 * CHART_PANEL_H + 2 * CHART_GAP + 50, rc;
  const void *chunk;
  size_t size;
  double scale = 100, x0, x1;
  if (n < 0 || (n > 0 && !epoch)) return tt_fail(err, "%s: chart needs epochs for its %d points", path, n);
  if (nst < 0) return tt_fail(err, "%s: chart given %d logged intervals", path, nst);
  /* accuracy arrives as a fraction from tt_train; a caller passing percentages already (any
   * value over 1) is drawn as given */
  for (i = 0; test_acc && i < n; i++)
    if (isfinite(test_acc[i]) && test_acc[i] > 1.0) scale = 1;
  memset(&b, 0, sizeof b);
  /* the per-interval training loss first, thin and pale, so the per-epoch curves stay on top */
  loss[0] = chart_ser(nst ? st->x : NULL, nst ? st->loss : NULL, nst, 1, "train loss (logged)", "#9ecae1", "step_loss", 0, 1);
  loss[1] = chart_ser(epoch, train_loss, n, 1, "train loss (epoch)", "#1f77b4", "train_loss", 0, 0);
  loss[2] = chart_ser(epoch, test_loss, n, 1, "test loss", "#d62728", "test_loss", 1, 0);
  acc[0] = chart_ser(epoch, test_acc, n, scale, "test accuracy", "#2ca02c", "test_accuracy", 0, 0);
  lr[0] = chart_ser(nst ? st->x : NULL, nst ? st->lr : NULL, nst, 1, "learning rate", "#9467bd", "lr", 0, 0);
  all[0] = loss[0], all[1] = loss[1], all[2] = loss[2], all[3] = acc[0], all[4] = lr[0];
  chart_xrange(all, 5, &x0, &x1);
  tt_strbuf_printf(&b,
               "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n"
               "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">",
               CHART_W, height, CHART_W, height, CHART_W / 2);
  tt_svg_escape(&b, title && title[0] ? title : "training");
  tt_strbuf_printf(&b, "</text>\n");
  chart_panel(&b, x0, x1, loss, 3, CHART_TOP, "loss", 0);
  chart_panel(&b, x0, x1, acc, 1, CHART_TOP + CHART_PANEL_H + CHART_GAP, "test accuracy (%)", 1);
  chart_panel(&b, x0, x1, lr, 1, CHART_TOP + 2 * (CHART_PANEL_H + CHART_GAP), "learning rate", 0);
  tt_strbuf_printf(&b, "</svg>\n");
  if (b.oom) {
    free(b.p);
    return tt_fail(err, "%s: out of host memory building the chart", path);
  }
  chunk = b.p;
  size = b.n;
  /* atomic: the chart is rewritten after every epoch, and a browser refreshing it, or a kill,
   * must never see half a file */
  rc = tt_write_file_atomic(path, &chunk, &size, 1, err);
  free(b.p);
  return rc;
}
