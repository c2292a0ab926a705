/* The OpenCL C sources of kernels/opencl, embedded at build time by embed_cl.py. */
#ifndef DRAY_OCL_SOURCES_H
#define DRAY_OCL_SOURCES_H

extern const char *const dray_ocl_sources[];
extern const char *const dray_ocl_source_names[];
extern const unsigned dray_ocl_source_count;

#endif
