/* core/data/dataset.c — freeing a data set, whichever reader filled it (data_idx.c,
 * data_image.c, data_npy.c, or the synthetic set of data.c). */
#include "dataset.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Frees whatever the reader allocated (paths, class names, images and labels, or the npy
 * mapping and its descriptor) and zeroes ds; NULL and an empty set are fine. */
void tt_dataset_free(tt_dataset *ds) {
  int i;
  if (!ds) return;
  if (ds->paths)
    for (i = 0; i < ds->n; i++) free(ds->paths[i]);
  if (ds->class_names)
    for (i = 0; i < ds->classes; i++) free(ds->class_names[i]);
  free(ds->paths);
  free(ds->class_names);
  if (ds->map) {
    munmap(ds->map, ds->map_bytes); /* images point into it */
    close(ds->map_fd);
  } else
    free(ds->images);
  free(ds->labels);
  memset(ds, 0, sizeof *ds);
}
