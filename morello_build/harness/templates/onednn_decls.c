/* oneDNN's C API (dnnl.h, v3), declared by hand: its handles are opaque pointers. */
typedef struct mb_dnnl_opaque *mb_dnnl_h;
typedef struct { int arg; mb_dnnl_h memory; } mb_dnnl_arg;
typedef struct { int major, minor, patch; const char *hash; unsigned cpu_runtime, gpu_runtime; } mb_dnnl_version_t;
const mb_dnnl_version_t *dnnl_version(void);
int dnnl_engine_create(mb_dnnl_h *, int, size_t);
int dnnl_stream_create(mb_dnnl_h *, mb_dnnl_h, unsigned);
int dnnl_memory_desc_create_with_tag(mb_dnnl_h *, int, const int64_t *, int, int);
int dnnl_softmax_forward_primitive_desc_create(mb_dnnl_h *, mb_dnnl_h, int, int, mb_dnnl_h, mb_dnnl_h, int, mb_dnnl_h);
int dnnl_eltwise_forward_primitive_desc_create(mb_dnnl_h *, mb_dnnl_h, int, int, mb_dnnl_h, mb_dnnl_h, float, float, mb_dnnl_h);
int dnnl_reduction_primitive_desc_create(mb_dnnl_h *, mb_dnnl_h, int, mb_dnnl_h, mb_dnnl_h, float, float, mb_dnnl_h);
int dnnl_primitive_create(mb_dnnl_h *, mb_dnnl_h);
int dnnl_memory_create(mb_dnnl_h *, mb_dnnl_h, mb_dnnl_h, void *);
int dnnl_primitive_execute(mb_dnnl_h, mb_dnnl_h, int, const mb_dnnl_arg *);
int dnnl_stream_wait(mb_dnnl_h);
static mb_dnnl_h mb_dnnl_prim, mb_dnnl_stream;
static mb_dnnl_arg mb_dnnl_args[2];
static char mb_dnnl_why[160];
