/* tests/gpu/cudnn_probe.c — which (x, y, filter) tensor formats cuDNN's legacy convolution API
 * serves, per direction, for fp16 and bf16: for each of ten shapes (ResNet-50's, LeNet's, the
 * tests') and each of the eight NCHW/NHWC combinations, the cudnnGet*Algorithm_v7 entries
 * returned / with status success / whose workspace query succeeded, and whether the first of
 * them ran ("+") or failed ("x"); "!" marks a query that failed outright. A diagnostic for a GPU
 * machine, not part of the build (`ninja cuda-check` compiles it, syntax only, so it keeps up
 * with cuDNN's header): there,
 *   gcc -O1 -std=c11 -I<cuda>/include tests/gpu/cudnn_probe.c -o cudnn_probe -L<cuda>/lib64 -lcudnn -lcudart
 *   <bundle>/tt-env ./cudnn_probe
 * What it printed on the first H100 run (cuDNN 9.19) is in docs/gpu.md; kernels/cuda/cuda_conv.cu's
 * cuda_conv_view and the emulation's emu_formats_ok follow it. Needs about 2 GiB of device memory. */
#include <cudnn.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
typedef struct { int n, c, h, w, k, r, s, st, pad; const char *name; } shp;
static const char *F(int f) { return f ? "NHWC" : "NCHW"; }
int main(void) {
  shp S[] = {{64, 3, 224, 224, 64, 7, 7, 2, 3, "r50.conv1"}, {64, 64, 56, 56, 64, 3, 3, 1, 1, "r50.3x3.64"},
             {64, 256, 56, 56, 64, 1, 1, 1, 0, "r50.1x1.256-64"}, {64, 512, 7, 7, 2048, 1, 1, 1, 0, "r50.l4.conv3"},
             {64, 256, 56, 56, 512, 1, 1, 2, 0, "r50.down"}, {32, 32, 14, 14, 64, 3, 3, 1, 1, "lenet.conv2"},
             {6, 10, 2, 2, 8, 3, 3, 1, 1, "small.conv5"}, {3, 3, 9, 9, 8, 3, 3, 1, 1, "test.c3"},
             {128, 96, 7, 7, 96, 3, 3, 1, 1, "fres.l3"}, {32, 1, 28, 28, 32, 3, 3, 1, 1, "lenet.conv1"}};
  cudnnHandle_t h;
  if (cudnnCreate(&h)) { printf("cudnnCreate failed\n"); return 1; }
  printf("cuDNN %zu\n", cudnnGetVersion());
  cudnnTensorDescriptor_t x, y; cudnnFilterDescriptor_t w; cudnnConvolutionDescriptor_t cv;
  cudnnCreateTensorDescriptor(&x); cudnnCreateTensorDescriptor(&y); cudnnCreateFilterDescriptor(&w);
  cudnnCreateConvolutionDescriptor(&cv);
  void *buf = NULL; size_t bufsz = (size_t)1 << 31;
  if (cudaMalloc(&buf, bufsz)) { printf("cudaMalloc failed\n"); return 1; }
  cudaMemset(buf, 0x3c, bufsz);
  for (int di = 0; di < 2; di++) {
    cudnnDataType_t dt = di ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    for (unsigned si = 0; si < sizeof S / sizeof S[0]; si++) {
      shp a = S[si];
      int p = (a.h + 2 * a.pad - a.r) / a.st + 1, q = (a.w + 2 * a.pad - a.s) / a.st + 1;
      for (int combo = 0; combo < 8; combo++) {
        int fx = combo & 1, fy = (combo >> 1) & 1, fw = (combo >> 2) & 1;
        char line[512]; int o = 0;
        cudnnSetTensor4dDescriptor(x, fx ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, dt, a.n, a.c, a.h, a.w);
        cudnnSetTensor4dDescriptor(y, fy ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, dt, a.n, a.k, p, q);
        cudnnSetFilter4dDescriptor(w, dt, fw ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, a.k, a.c, a.r, a.s);
        cudnnSetConvolution2dDescriptor(cv, a.pad, a.pad, a.st, a.st, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
        cudnnSetConvolutionMathType(cv, CUDNN_TENSOR_OP_MATH);
        o += snprintf(line + o, sizeof line - o, "%s %-16s x %s y %s w %s:", di ? "bf16" : "fp16", a.name, F(fx), F(fy), F(fw));
        for (int dir = 0; dir < 3; dir++) {
          int nret = 0, ok = 0, wsok = 0, ran = 0; cudnnStatus_t e; int first = -1; size_t fws = 0; cudnnMathType_t fm = 0;
          if (dir == 0) {
            cudnnConvolutionFwdAlgoPerf_t pf[16];
            e = cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, cv, y, 8, &nret, pf);
            for (int i = 0; i < nret; i++) if (pf[i].status == 0) { size_t ws; ok++; cudnnSetConvolutionMathType(cv, pf[i].mathType);
              if (!cudnnGetConvolutionForwardWorkspaceSize(h, x, w, cv, y, pf[i].algo, &ws)) { wsok++; if (first < 0) first = pf[i].algo, fws = ws, fm = pf[i].mathType; } }
          } else if (dir == 1) {
            cudnnConvolutionBwdDataAlgoPerf_t pf[16];
            e = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, cv, x, 6, &nret, pf);
            for (int i = 0; i < nret; i++) if (pf[i].status == 0) { size_t ws; ok++; cudnnSetConvolutionMathType(cv, pf[i].mathType);
              if (!cudnnGetConvolutionBackwardDataWorkspaceSize(h, w, y, cv, x, pf[i].algo, &ws)) { wsok++; if (first < 0) first = pf[i].algo, fws = ws, fm = pf[i].mathType; } }
          } else {
            cudnnConvolutionBwdFilterAlgoPerf_t pf[16];
            e = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, cv, w, 7, &nret, pf);
            for (int i = 0; i < nret; i++) if (pf[i].status == 0) { size_t ws; ok++; cudnnSetConvolutionMathType(cv, pf[i].mathType);
              if (!cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x, y, cv, w, pf[i].algo, &ws)) { wsok++; if (first < 0) first = pf[i].algo, fws = ws, fm = pf[i].mathType; } }
          }
          if (first >= 0) { /* run the first one that sized */
            size_t xb = (size_t)a.n * a.c * a.h * a.w * 2, yb = (size_t)a.n * a.k * p * q * 2, wb = (size_t)a.k * a.c * a.r * a.s * 2;
            char *X = (char *)buf, *Y = X + ((xb + 255) & ~255ul), *W = Y + ((yb + 255) & ~255ul), *WS = W + ((wb + 255) & ~255ul);
            float one = 1, zero = 0;
            cudnnSetConvolutionMathType(cv, fm);
            if ((size_t)(WS - X) + fws < bufsz) {
              cudnnStatus_t r = dir == 0 ? cudnnConvolutionForward(h, &one, x, X, w, W, cv, (cudnnConvolutionFwdAlgo_t)first, WS, fws, &zero, y, Y)
                              : dir == 1 ? cudnnConvolutionBackwardData(h, &one, w, W, y, Y, cv, (cudnnConvolutionBwdDataAlgo_t)first, WS, fws, &zero, x, X)
                                         : cudnnConvolutionBackwardFilter(h, &one, x, X, y, Y, cv, (cudnnConvolutionBwdFilterAlgo_t)first, WS, fws, &zero, w, W);
              ran = r == 0 && cudaDeviceSynchronize() == 0 ? 1 : -(int)r;
            }
          }
          cudnnSetConvolutionMathType(cv, CUDNN_TENSOR_OP_MATH);
          o += snprintf(line + o, sizeof line - o, " %s %d/%d/%d%s", dir == 0 ? "F" : dir == 1 ? "D" : "W", nret, ok, wsok,
                        e ? "!" : ran == 1 ? "+" : ran < 0 ? "x" : "");
        }
        puts(line);
      }
    }
  }
  return 0;
}
