/* core/data/data.h — the whole data stage in one include, for its users outside core/data/
 * (core/app/, the tests): data sets (dataset.h), image decoders (decode.h) and the loader
 * threads (loader.h). The files of core/data/ include only the header they use, never this
 * one, so no header of the folder is shared by all of its files. */
#ifndef TT_DATA_H
#define TT_DATA_H
#include "dataset.h"
#include "decode.h"
#include "loader.h"
#endif
