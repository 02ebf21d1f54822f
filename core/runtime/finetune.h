/* core/runtime/finetune.h — loading what matches of a pretrained weights file (core/runtime/finetune.c). */
#ifndef TT_FINETUNE_H
#define TT_FINETUNE_H
#include "exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gives every parameter whose name and shape match a tensor of file (F32, F16 or BF16) its
 * values; the others keep theirs (call after tt_exec_init_params). report: one line saying
 * what was loaded, skipped (with both shapes) and freshly initialised. A file matching nothing
 * is an error. */
int tt_finetune_load(tt_exec *x, const char *file, tt_strbuf *report, int *loaded, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
