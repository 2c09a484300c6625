#include "${header}.h"
extern void *morello_bench_buf[];
void ${run}(void);
void ${run}(void) { ${kernel}(${args}); }
