/* core/app/plan_svg.c — see plan_svg.h. Plain SVG 1.1 text in chart.c's style: no scripts, no
 * external fonts, every name the user wrote escaped.
 *
 * x is the Program op (one column per op, micro-step then update phase), y the bytes live
 * there, counted as the arena's lower bound counts them (tt_program_buf_live), so the top of
 * the stack at its highest is peak_live_bytes. */
#include "plan_svg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/fileio.h"
#include "chart.h"

#define SVG_W 1100
#define SVG_H 600
#define SVG_LEFT 80
#define SVG_RIGHT 250 /* the legend and the peak's buffers */
#define SVG_TOP 60
#define SVG_PH 440
#define SVG_TOPN 5 /* buffers labelled at the peak */
#define SVG_LANE 150 /* the pinned host lane between the plot and the legend, when the plan offloads */
#define SVG_LANE_BAR 56 /* the lane's bar */
#define SVG_KEY_CHARS 38 /* characters of a 10-pixel line in the legend's width (SVG_RIGHT) */

/* The stacked categories, bottom to top: the program.h classes, activations split into those
 * kept from the forward pass and those a recompute op produced. PC_MASTERS, last so that the
 * others keep their data-class numbers, is the fp32 masters offload 2 holds in pinned host memory
 * (core/compile/offload.h): only the host lane has it, at its bottom (svg_lane_cat). */
enum { PC_WEIGHTS, PC_GRADS, PC_OPT, PC_COPIES, PC_KEPT, PC_RECOMP, PC_ACT_GRADS, PC_WS, PC_MASTERS, PC_N };
static const char *const pc_name[PC_N] = {"weights, BN statistics, loss stats", "gradients (fp32)", "optimizer state",
                                          "16-bit weight copies", "activations kept", "activations recomputed",
                                          "activation gradients", "workspaces", "fp32 master weights"};
static const char *const pc_color[PC_N] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                           "#59a14f", "#b07aa1", "#edc948", "#9c755f", "#1f3f66"};

/* The host lane's k-th category from the bottom (k < PC_N): the masters, then the device order. */
static int svg_lane_cat(int k) { return k == 0 ? PC_MASTERS : k - 1; }

/* The stacked category of buffer b: by its program.h class, and for activations by whether
 * the op that first writes it is a recompute op (recomputed) or not (kept from the forward). */
static int svg_cat(const tt_program *p, const tt_buf *b) {
  switch (b->cls) {
    case TT_BC_PARAMS: return b->host ? PC_MASTERS : PC_WEIGHTS; /* host: an offloaded master */
    case TT_BC_MISC: return PC_WEIGHTS;
    case TT_BC_GRADS: return PC_GRADS;
    case TT_BC_OPTIMIZER: return PC_OPT;
    case TT_BC_WEIGHT_COPIES: return PC_COPIES;
    case TT_BC_ACT_GRADS: return PC_ACT_GRADS;
    case TT_BC_WORKSPACE: return PC_WS;
    default:
      return b->first >= 0 && b->first < p->nsteps && (p->steps[b->first].flags & TT_SF_RECOMPUTE) ? PC_RECOMP : PC_KEPT;
  }
}

/* live[s * PC_N + c]: bytes of category c live at op s; the total's peak and its op.
 * Built as a difference array (+size at a buffer's first op, -size after its last, then
 * prefix sums), so it costs O(buffers + ops x categories) instead of one pass per op. The
 * caller frees the array; NULL when out of memory. */
static size_t *svg_live(const tt_program *p, size_t *peak, int *peak_op) {
  int n = p->nsteps, f, l;
  size_t *live = (size_t *)calloc((size_t)(n + 1) * PC_N, sizeof(size_t));
  if (!live) return NULL;
  for (int i = 0; i < p->nbufs; i++) { /* +size at the first op, -size after the last (wrapping sums) */
    size_t sz = tt_program_buf_live(p, i, &f, &l);
    if (!sz || f > l || f < 0 || l >= n) continue;
    int c = svg_cat(p, &p->bufs[i]);
    live[(size_t)f * PC_N + c] += sz;
    live[(size_t)(l + 1) * PC_N + c] -= sz;
  }
  *peak = 0, *peak_op = 0;
  for (int s = 0; s < n; s++) {
    size_t tot = 0;
    for (int c = 0; c < PC_N; c++) {
      if (s) live[(size_t)s * PC_N + c] += live[(size_t)(s - 1) * PC_N + c];
      tot += live[(size_t)s * PC_N + c];
    }
    if (tot > *peak) *peak = tot, *peak_op = s;
  }
  return live;
}

/* Bytes to MiB for labels. */
static double svg_mib(size_t b) { return b / 1048576.0; }

typedef struct svg_axes {
  int nsteps;
  double ymax; /* bytes at the top of the plot */
  int lane;    /* pixels of the pinned host lane right of the plot (0: the plan offloads nothing) */
} svg_axes;

/* Op index (fractional: op + 0.5 is the middle of its column) to x in pixels over the plot's
 * width; a program of n ops spans [0, n]. */
static double svg_x(const svg_axes *a, double op, int nsteps) {
  return SVG_LEFT + op / (nsteps > 0 ? nsteps : 1) * (SVG_W - SVG_LEFT - SVG_RIGHT);
}
/* Bytes to y in pixels: 0 at the plot's bottom, a->ymax at its top (SVG's y grows down). */
static double svg_y(const svg_axes *a, double bytes) { return SVG_TOP + SVG_PH - bytes / a->ymax * SVG_PH; }

/* The alternative the search rejected whose peak differs: the chosen policy without recompute,
 * else in fp32 when it is fp16 or bf16. 0 and an empty program when there is none. */
static int svg_alt(tt_session *s, tt_program *alt, const char **what) {
  tt_policy pol = s->sched.policy;
  tt_err err;
  memset(alt, 0, sizeof *alt);
  if (s->sched.recomputed_units > 0) pol.recompute = NULL, *what = "without recompute";
  else if (pol.act_dtype != TT_F32) pol.act_dtype = TT_F32, *what = "in fp32";
  else return 0;
  if (tt_policy_plan(&s->graph, &pol, s->be, alt, &err)) return 0; /* alt freed */
  return 1;
}

/* The recompute segments (runs of recompute ops, shaded behind the stack) and the y grid, in
 * MiB or GiB as the scale needs; returns how many segments (the legend names them). */
static int svg_segments_grid(tt_strbuf *b, const tt_program *p, const svg_axes *a, int pw) {
  int n = p->nsteps;
  int nseg = 0;
  for (int i = 0; i < n;) {
    if (!(p->steps[i].flags & TT_SF_RECOMPUTE)) { i++; continue; }
    int j = i;
    while (j < n && (p->steps[j].flags & TT_SF_RECOMPUTE)) j++;
    double x0 = svg_x(a, i, n), x1 = svg_x(a, j, n);
    tt_strbuf_printf(b, "<rect class=\"recompute\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"#d9c8f0\" "
                         "fill-opacity=\"0.55\"/>\n", x0, SVG_TOP, x1 - x0 < 1 ? 1.0 : x1 - x0, SVG_PH);
    nseg++, i = j;
  }
  /* y grid in MiB or GiB */
  double unit = a->ymax >= 4.0 * 1073741824.0 ? 1073741824.0 : 1048576.0, top = a->ymax / unit;
  double raw = top / 6, mag = pow(10, floor(log10(raw > 0 ? raw : 1))), fr = raw / mag;
  double step = (fr <= 1 ? 1 : fr <= 2 ? 2 : fr <= 5 ? 5 : 10) * mag;
  for (int k = 0; k < 50 && k * step <= top; k++) {
    double y = svg_y(a, k * step * unit);
    tt_strbuf_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                         "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%g</text>\n",
                     SVG_LEFT, y, SVG_LEFT + pw, y, SVG_LEFT - 6, y + 4, k * step);
  }
  tt_strbuf_printf(b, "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 18 %d)\">"
                       "live %s</text>\n", SVG_TOP + SVG_PH / 2, SVG_TOP + SVG_PH / 2, unit > 1048576.0 ? "GiB" : "MiB");
  return nseg;
}

/* The stack of categories (live[op * PC_N + c], from svg_live), the start of the update phase,
 * the rejected alternative's total (alive, over its own alt_ops ops; NULL: none) and the budget
 * line (0: none). */
static void svg_stack(tt_strbuf *b, const tt_program *p, const svg_axes *a, int pw, const size_t *live, const size_t *alive,
                      int alt_ops, size_t budget) {
  int n = p->nsteps;
  /* the stack: one polygon per category, between the cumulative sums below and with it */
  for (int c = 0; c < PC_N; c++) {
    int any = 0;
    for (int i = 0; i < n && !any; i++) any = live[(size_t)i * PC_N + c] != 0;
    if (!any) continue;
    tt_strbuf_printf(b, "<polygon data-class=\"%d\" fill=\"%s\" stroke=\"none\" points=\"", c, pc_color[c]);
    for (int i = 0; i < n; i++) { /* the upper edge left to right, as steps */
      size_t up = 0;
      for (int k = 0; k <= c; k++) up += live[(size_t)i * PC_N + k];
      tt_strbuf_printf(b, "%.2f,%.2f %.2f,%.2f ", svg_x(a, i, n), svg_y(a, (double)up), svg_x(a, i + 1, n),
                       svg_y(a, (double)up));
    }
    for (int i = n - 1; i >= 0; i--) { /* the lower edge back */
      size_t lo = 0;
      for (int k = 0; k < c; k++) lo += live[(size_t)i * PC_N + k];
      tt_strbuf_printf(b, "%.2f,%.2f %.2f,%.2f ", svg_x(a, i + 1, n), svg_y(a, (double)lo), svg_x(a, i, n),
                       svg_y(a, (double)lo));
    }
    tt_strbuf_printf(b, "\"/>\n");
  }
  /* the update phase starts at micro_end; its label at the top, where no bar reaches (the
   * persistent buffers fill the bottom of the panel) */
  if (p->micro_end > 0 && p->micro_end < n) {
    double x = svg_x(a, p->micro_end, n);
    tt_strbuf_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#666\" stroke-dasharray=\"2 3\"/>\n"
                         "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" fill=\"#666\">update</text>\n",
                     x, SVG_TOP, x, SVG_TOP + SVG_PH, x + 3, SVG_TOP + 12);
  }
  /* the rejected alternative: a thin line over its own ops, scaled to the same width */
  if (alive) {
    tt_strbuf_printf(b, "<polyline class=\"alternative\" fill=\"none\" stroke=\"#222\" stroke-width=\"1\" "
                         "stroke-dasharray=\"4 2\" points=\"");
    for (int i = 0; i < alt_ops; i++) {
      size_t tot = 0;
      for (int c = 0; c < PC_N; c++) tot += alive[(size_t)i * PC_N + c];
      tt_strbuf_printf(b, "%.2f,%.2f %.2f,%.2f ", svg_x(a, i, alt_ops), svg_y(a, (double)tot),
                       svg_x(a, i + 1, alt_ops), svg_y(a, (double)tot));
    }
    tt_strbuf_printf(b, "\"/>\n");
  }
  /* the budget */
  if (budget) {
    double y = svg_y(a, (double)budget);
    tt_strbuf_printf(b, "<line class=\"budget\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#c00\" "
                         "stroke-width=\"2\" stroke-dasharray=\"8 4\"/>\n<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" "
                         "font-size=\"11\" fill=\"#c00\">budget %.1f MiB</text>\n",
                     SVG_LEFT, y, SVG_LEFT + pw, y, SVG_LEFT + pw - 4, y - 4, svg_mib(budget));
  }
}

/* The peak's marker at op peak_op (peak bytes live), and beside the plot the buffers live there
 * that hold the most; *ly_out: the legend's first line. */
static void svg_peak(tt_strbuf *b, const tt_program *p, const svg_axes *a, int pw, size_t peak, int peak_op, int *ly_out) {
  int n = p->nsteps;
  /* the peak: a marker, and the largest buffers live there */
  double px = svg_x(a, peak_op + 0.5, n), py = svg_y(a, (double)peak);
  tt_strbuf_printf(b, "<line class=\"peak\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/>\n"
                       "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#000\"/>\n"
                       "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"11\" font-weight=\"bold\">peak %.1f MiB "
                       "at op %d",
                   px, SVG_TOP + SVG_PH, px, py, px, py, px < SVG_LEFT + pw / 2 ? px + 6 : px - 6, py - 6,
                   px < SVG_LEFT + pw / 2 ? "start" : "end", svg_mib(peak), peak_op);
  if (p->steps[peak_op].name) {
    tt_strbuf_printf(b, " (");
    tt_svg_escape(b, p->steps[peak_op].name);
    tt_strbuf_printf(b, ")");
  }
  tt_strbuf_printf(b, "</text>\n");
  int top_i[SVG_TOPN], ntop = 0, f, l;
  for (int i = 0; i < p->nbufs; i++) { /* insertion into the top few by bytes live at the peak */
    size_t sz = tt_program_buf_live(p, i, &f, &l);
    if (!sz || f > peak_op || l < peak_op) continue;
    int k = ntop < SVG_TOPN ? ntop++ : SVG_TOPN;
    while (k > 0 && tt_program_buf_live(p, top_i[k - 1], &f, &l) < sz) {
      if (k < SVG_TOPN) top_i[k] = top_i[k - 1];
      k--;
    }
    if (k < SVG_TOPN) top_i[k] = i;
  }
  int lx = SVG_LEFT + pw + 14 + a->lane, ly = SVG_TOP + 6;
  tt_strbuf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"12\" font-weight=\"bold\">largest at the peak</text>\n", lx, ly);
  for (int k = 0; k < ntop; k++) {
    const tt_buf *bf = &p->bufs[top_i[k]];
    ly += 16;
    tt_strbuf_printf(b, "<text class=\"peak-buffer\" x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"%s\">%.1f MiB ", lx, ly,
                     pc_color[svg_cat(p, bf)], svg_mib(tt_program_buf_live(p, top_i[k], &f, &l)));
    tt_svg_escape(b, bf->name);
    tt_strbuf_printf(b, "</text>\n");
  }
  *ly_out = ly;
}

/* The legend under the peak's buffers, from line ly: the categories (the fp32 masters only where
 * the host holds some, masters != 0, and then the 16-bit copies said to be theirs), then the
 * segments, the budget and the rejected alternative (alt_what, its peak apeak over alt_ops ops)
 * where drawn; returns the line after it. */
static int svg_legend(tt_strbuf *b, int lx, int ly, int nseg, size_t budget, int alive, const char *alt_what, size_t apeak,
                       int alt_ops, int masters) {
  ly += 30;
  for (int c = PC_N - 1; c >= 0; c--) {
    if (c == PC_MASTERS && !masters) continue;
    tt_strbuf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"12\" fill=\"%s\"/>\n"
                         "<text x=\"%d\" y=\"%d\" font-size=\"11\">%s%s</text>\n", lx, ly - 10, pc_color[c], lx + 20, ly,
                     c == PC_COPIES && masters ? "16-bit copies of host masters" : pc_name[c], c == PC_MASTERS ? " (pinned host)" : "");
    ly += 18;
  }
  if (nseg)
    tt_strbuf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"12\" fill=\"#d9c8f0\"/>\n"
                         "<text x=\"%d\" y=\"%d\" font-size=\"11\">recompute ops (%d segments)</text>\n",
                     lx, ly - 10, lx + 20, ly, nseg), ly += 18;
  if (budget)
    tt_strbuf_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#c00\" stroke-width=\"2\" "
                         "stroke-dasharray=\"8 4\"/>\n<text x=\"%d\" y=\"%d\" font-size=\"11\">budget</text>\n",
                     lx, ly - 4, lx + 14, ly - 4, lx + 20, ly), ly += 18;
  if (alive)
    tt_strbuf_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#222\" stroke-dasharray=\"4 2\"/>\n"
                         "<text x=\"%d\" y=\"%d\" font-size=\"11\">%s (rejected)</text>\n"
                         "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#666\">peak %.1f MiB, over its own %d ops</text>\n",
                     lx, ly - 4, lx + 14, ly - 4, lx + 20, ly, alt_what, lx + 20, ly + 13, svg_mib(apeak), alt_ops), ly += 31;
  return ly;
}

/* The bytes of p's host buffers (planned host offload, tt_buf.host) by stacked category, aligned as
 * the host region lays them out (core/compile/offload.c), and how many there are (*nhost: state,
 * masters and saved activations alike); returns their sum. */
static size_t svg_host(const tt_program *p, size_t cat[PC_N], int *nhost) {
  size_t a = p->align ? p->align : 1, sum = 0;
  memset(cat, 0, PC_N * sizeof(size_t));
  *nhost = 0;
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].host) {
      size_t sz = (p->bufs[i].bytes + a - 1) / a * a;
      cat[svg_cat(p, &p->bufs[i])] += sz, sum += sz, ++*nhost;
    }
  return sum;
}

/* The pinned host lane beside the device plot, from x0: what the plan holds in pinned host memory
 * (cat, by category, on the plot's byte scale: the host region is held for the whole run, so it is
 * one bar; the fp32 masters of offload 2 at its bottom, labelled with their bytes, --json's
 * master_bytes), its bytes (p->host_bytes, plan --json's offload_bytes) and the host budget
 * (host_budget, --host-mem: a line where it falls on the scale, else said in words). */
static void svg_host_lane(tt_strbuf *b, const tt_program *p, const svg_axes *a, int x0, const size_t cat[PC_N],
                          size_t host_budget) {
  int bx = x0 + (SVG_LANE - 14 - SVG_LANE_BAR) / 2;
  size_t up = 0;
  tt_strbuf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" font-weight=\"bold\">device arena</text>\n", SVG_LEFT,
                   SVG_TOP - 4); /* the plot's name, beside the lane's */
  tt_strbuf_printf(b, "<g class=\"host-lane\" data-host-bytes=\"%zu\" data-host-budget-bytes=\"%zu\"", p->host_bytes,
                   host_budget);
  if (p->n_masters_offloaded) tt_strbuf_printf(b, " data-master-bytes=\"%zu\"", p->master_offload_bytes);
  tt_strbuf_printf(b, ">\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f3f3f3\" stroke=\"#444\" "
                       "stroke-dasharray=\"3 2\"/>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\" "
                       "font-weight=\"bold\">pinned host</text>\n",
                   x0, SVG_TOP, SVG_LANE - 14, SVG_PH, x0 + (SVG_LANE - 14) / 2, SVG_TOP - 4);
  for (int k = 0; k < PC_N; k++) {
    int c = svg_lane_cat(k);
    if (!cat[c]) continue;
    double y1 = svg_y(a, (double)up), y0 = svg_y(a, (double)(up + cat[c]));
    tt_strbuf_printf(b, "<rect class=\"host-bytes\" data-class=\"%d\" data-bytes=\"%zu\" x=\"%d\" y=\"%.2f\" "
                         "width=\"%d\" height=\"%.2f\" fill=\"%s\"/>\n",
                     c, cat[c], bx, y0, SVG_LANE_BAR, y1 - y0, pc_color[c]);
    if (c == PC_MASTERS && y1 - y0 >= 26) /* the masters' label: in their part where two lines fit */
      tt_strbuf_printf(b, "<text class=\"host-masters\" data-class=\"%d\" x=\"%d\" y=\"%.1f\" text-anchor=\"middle\" "
                           "font-size=\"10\" fill=\"#fff\">masters<tspan x=\"%d\" dy=\"12\">%.1f MiB</tspan></text>\n",
                       c, bx + SVG_LANE_BAR / 2, (y0 + y1) / 2 - 2, bx + SVG_LANE_BAR / 2, svg_mib(p->master_offload_bytes));
    else if (c == PC_MASTERS) /* too thin: under the lane, below the host budget's words */
      tt_strbuf_printf(b, "<text class=\"host-masters\" data-class=\"%d\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" "
                           "font-size=\"10\" fill=\"%s\">fp32 masters %.1f MiB</text>\n",
                       c, x0 + (SVG_LANE - 14) / 2, SVG_TOP + SVG_PH + 28, pc_color[c], svg_mib(p->master_offload_bytes));
    up += cat[c];
  }
  double ytop = svg_y(a, (double)up);
  tt_strbuf_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%.1f MiB</text>\n",
                   bx + SVG_LANE_BAR / 2, ytop - 4, svg_mib(p->host_bytes));
  if (host_budget && (double)host_budget <= a->ymax) {
    double y = svg_y(a, (double)host_budget);
    tt_strbuf_printf(b, "<line class=\"host-budget\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#c00\" "
                         "stroke-width=\"2\" stroke-dasharray=\"8 4\"/>\n<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" "
                         "font-size=\"10\" fill=\"#c00\">host budget</text>\n",
                     x0, y, x0 + SVG_LANE - 14, y, x0 + SVG_LANE - 16, y - 4);
  } else if (host_budget) { /* above the scale: in words, under the lane */
    tt_strbuf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\" fill=\"#c00\">"
                         "host budget %.1f GiB</text>\n", x0 + (SVG_LANE - 14) / 2, SVG_TOP + SVG_PH + 14,
                     host_budget / 1073741824.0);
  }
  tt_strbuf_printf(b, "</g>\n");
}

/* The lane's key in the legend, from line ly at lx: the lane's bytes, what it holds (cat's
 * categories in the lane's order, wrapped after a comma where a line would pass SVG_KEY_CHARS),
 * how many buffers (nhost) and the device window they stream through. */
static void svg_host_key(tt_strbuf *b, const tt_program *p, int lx, int ly, const size_t cat[PC_N], int nhost) {
  tt_strbuf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"12\" fill=\"#f3f3f3\" stroke=\"#444\" "
                       "stroke-dasharray=\"3 2\"/>\n<text class=\"host-legend\" x=\"%d\" y=\"%d\" font-size=\"11\">"
                       "pinned host (offload): %.1f MiB</text>\n<text class=\"host-key\" x=\"%d\" y=\"%d\" font-size=\"10\" "
                       "fill=\"#666\">", lx, ly - 10, lx + 20, ly, svg_mib(p->host_bytes), lx + 20, ly + 13);
  size_t col = 0;
  for (int k = 0, j = 0; k < PC_N; k++) {
    const char *nm = pc_name[svg_lane_cat(k)];
    if (!cat[svg_lane_cat(k)]) continue;
    if (j++ && col + 2 + strlen(nm) > SVG_KEY_CHARS) /* the comma ends this line, the name starts the next */
      ly += 13, col = 0, tt_strbuf_printf(b, ",</text>\n<text class=\"host-key\" x=\"%d\" y=\"%d\" font-size=\"10\" "
                                              "fill=\"#666\">", lx + 20, ly + 13);
    else if (j > 1) tt_strbuf_printf(b, ", "), col += 2;
    tt_strbuf_printf(b, "%s", nm), col += strlen(nm);
  }
  tt_strbuf_printf(b, "</text>\n<text class=\"host-key\" x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#666\">%d buffers, "
                       "through a %.1f MiB window</text>\n", lx + 20, ly + 26, nhost, svg_mib(2 * p->offload_slot_bytes));
}

/* Draws the chosen plan's bytes live at each op (stacked by category) against the budget and the
 * rejected alternative, and writes it to path atomically. */
int tt_plan_svg(tt_session *s, const char *path, tt_err *err) {
  const tt_program *p = &s->sched.train;
  const tt_policy_result *r = &s->sched;
  size_t peak = 0, apeak = 0;
  int peak_op = 0, apeak_op = 0, n = p->nsteps;
  if (n <= 0) return tt_fail(err, "%s: the plan has no Program to draw", path);
  size_t *live = svg_live(p, &peak, &peak_op);
  if (!live) return tt_fail(err, "%s: out of host memory drawing the plan", path);
  tt_program alt;
  const char *alt_what = "";
  size_t *alive = NULL;
  if (svg_alt(s, &alt, &alt_what)) {
    alive = svg_live(&alt, &apeak, &apeak_op);
    if (alive && apeak == peak) free(alive), alive = NULL; /* the same peak: nothing to compare */
  }
  size_t hcat[PC_N];
  int nhost;
  size_t hsum = svg_host(p, hcat, &nhost);
  svg_axes a;
  a.nsteps = n;
  a.lane = hsum ? SVG_LANE : 0; /* without offload the picture is as it was */
  a.ymax = (double)peak;
  if ((double)hsum > a.ymax) a.ymax = (double)hsum;
  if ((double)r->budget_bytes > a.ymax) a.ymax = (double)r->budget_bytes;
  if (alive && (double)apeak > a.ymax) a.ymax = (double)apeak;
  a.ymax = a.ymax * 1.08 + 1;
  tt_strbuf b;
  memset(&b, 0, sizeof b);
  tt_strbuf_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                       "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
                       "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" data-peak-bytes=\"%zu\" data-peak-op=\"%d\" "
                       "data-budget-bytes=\"%zu\" data-arena-bytes=\"%zu\" data-ops=\"%d\"",
                   SVG_W + a.lane, SVG_H, SVG_W + a.lane, SVG_H, peak, peak_op, r->budget_bytes, p->arena_bytes, n);
  if (alive) tt_strbuf_printf(&b, " data-alt-peak-bytes=\"%zu\"", apeak);
  if (hsum) tt_strbuf_printf(&b, " data-host-bytes=\"%zu\"", p->host_bytes);
  tt_strbuf_printf(&b, ">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n"
                       "<text x=\"%d\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">",
                   (SVG_W - SVG_RIGHT + SVG_LEFT) / 2);
  tt_svg_escape(&b, s->model.name);
  tt_strbuf_printf(&b, ": bytes live at each Program op</text>\n"
                       "<text x=\"%d\" y=\"46\" text-anchor=\"middle\" font-size=\"12\">micro-batch %d x %d, %s, "
                       "recompute %d of %d units; arena %.1f MiB, lower bound %.1f MiB</text>\n",
                   (SVG_W - SVG_RIGHT + SVG_LEFT) / 2, r->policy.micro_batch, r->policy.accum_steps,
                   tt_dtype_name(r->policy.act_dtype), r->recomputed_units, r->nunits,
                   svg_mib(p->arena_bytes), svg_mib(p->peak_live_bytes));
  int pw = SVG_W - SVG_LEFT - SVG_RIGHT;
  tt_strbuf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#444\"/>\n", SVG_LEFT,
                   SVG_TOP, pw, SVG_PH);
  int nseg = svg_segments_grid(&b, p, &a, pw);
  svg_stack(&b, p, &a, pw, live, alive, alt.nsteps, r->budget_bytes);
  int ly, lx = SVG_LEFT + pw + 14 + a.lane;
  if (hsum) svg_host_lane(&b, p, &a, SVG_LEFT + pw + 14, hcat, s->policy_opts.host_bytes);
  svg_peak(&b, p, &a, pw, peak, peak_op, &ly);
  ly = svg_legend(&b, lx, ly, nseg, r->budget_bytes, alive != NULL, alt_what, apeak, alt.nsteps, hcat[PC_MASTERS] != 0);
  if (hsum) svg_host_key(&b, p, lx, ly, hcat, nhost);
  tt_strbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">Program op (%d: forward, loss, "
                       "backward, then the optimizer updates)</text>\n</svg>\n",
                   SVG_LEFT + pw / 2, SVG_TOP + SVG_PH + 30, n);
  free(live);
  free(alive);
  tt_program_free(&alt);
  if (b.oom) {
    free(b.p);
    return tt_fail(err, "%s: out of host memory drawing the plan", path);
  }
  const void *chunk = b.p;
  size_t size = b.n;
  int rc = tt_write_file_atomic(path, &chunk, &size, 1, err);
  free(b.p);
  return rc;
}
