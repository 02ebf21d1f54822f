/* core/base/data_cfg.h — a recipe's [data] section as plain data (tt_data_cfg): what the
 * recipe parser (core/compile/recipe.c) fills into tt_model.data and the data stage
 * (core/data/) reads.
 *
 * Why in base/: the stages run base -> compile -> data -> runtime -> app, and both compile (the
 * parser, model.h) and data (the readers, the loader's crop) need this struct. Defined in
 * compile/model.h, it made every file of data/ include the whole model (layers, [train]) for
 * one struct; defined in data/, compile could not see it. Here both see it and data/ includes
 * nothing of compile/. model.h includes this header, so tt_model users see no change. */
#ifndef TT_DATA_CFG_H
#define TT_DATA_CFG_H

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a path buffer, terminator included (recipe paths, data set files). */
#define TT_PATH_MAX 1024

typedef enum { TT_DATA_NONE = 0, TT_DATA_IDX, TT_DATA_FOLDER, TT_DATA_LIST, TT_DATA_SYNTHETIC, TT_DATA_NPY } tt_data_format;

typedef struct tt_data_cfg {
  tt_data_format format;
  /* idx: images and labels files (gzip or not); folder: a directory with one subfolder per
   * class; list: a text file of "path label" lines (paths relative to the list file). */
  char train[TT_PATH_MAX], train_labels[TT_PATH_MAX];
  char test[TT_PATH_MAX], test_labels[TT_PATH_MAX];
  float mean[4], std[4];        /* per channel, on [0,1] pixel values; default 0 and 1 */
  int crop_pad;                 /* random crop after zero padding by this many pixels; 0 = off */
  int hflip;                    /* random horizontal flip */
  int max_megapixels;           /* folder/list: decoders refuse larger images (0: 64) */
  int loader_threads;           /* training loader threads (0: TT_LOADER_THREADS, core/data/loader.h) */
  float max_failed;             /* folder/list: the share of images that may fail to decode before the run stops */
  int max_failed_set;           /* 0: max_failed not given (TT_DEFAULT_MAX_FAILED, core/data/dataset.h) */
  int random_resized_crop;      /* training: torchvision's RandomResizedCrop to the input size */
  float crop_scale[2], crop_ratio[2]; /* its area-fraction and aspect ranges (0: 0.08..1, 3/4..4/3) */
  int resize;                   /* evaluation: shorter side to this, then centre crop (0: fit) */
  char class_names[4096];       /* comma-separated names of [net] classes for list/idx/synthetic ("": 0, 1, ...) */
  int classes;                  /* [net] classes: the labels format = synthetic draws (0: 10) */
  int synthetic_size;           /* format = synthetic: training images (0: TT_SYNTHETIC_TRAIN, core/data/dataset.h) */
  int line;                     /* recipe line of [data] */
} tt_data_cfg;

#ifdef __cplusplus
}
#endif
#endif
