    {
        /* dnnl_cpu = 1, dnnl_stream_default_flags = 1, dnnl_ab = 3, forward_inference = 96;
           DNNL_ARG_SRC = 1, DNNL_ARG_DST = 17. */
        mb_dnnl_h eng = 0, sd = 0, dd = 0, pd = 0, ms = 0, md = 0;
        const int64_t dims[12] = {${rows}, ${n}}, ddims[12] = {${rows}, ${dst_n}};
        const mb_dnnl_version_t *ver = dnnl_version();
        int st = dnnl_engine_create(&eng, 1, 0);
        const char *step = "dnnl_engine_create (CPU)";
        if (st == 0) { step = "dnnl_stream_create"; st = dnnl_stream_create(&mb_dnnl_stream, eng, 1); }
        if (st == 0) { step = "dnnl_memory_desc_create_with_tag"; st = dnnl_memory_desc_create_with_tag(&sd, 2, dims, ${src_t}, 3); }
        if (st == 0) st = dnnl_memory_desc_create_with_tag(&dd, 2, ddims, ${dst_t}, 3);
        if (st == 0) { step = "the primitive descriptor"; st = ${create}; }
        if (st == 0) { step = "dnnl_primitive_create"; st = dnnl_primitive_create(&mb_dnnl_prim, pd); }
        if (st == 0) { step = "dnnl_memory_create"; st = dnnl_memory_create(&ms, sd, eng, buf[0]); }
        if (st == 0) st = dnnl_memory_create(&md, dd, eng, buf[1]);
        if (st != 0) {
            /* dnnl_status_t: 3 unimplemented; cpu_runtime 0x200 is SYCL (needs a SYCL CPU device). */
            snprintf(mb_dnnl_why, sizeof mb_dnnl_why,
                     "oneDNN %d.%d.%d (CPU runtime 0x%x) failed in %s: status %d%s",
                     ver->major, ver->minor, ver->patch, ver->cpu_runtime, step, st,
                     st == 3 ? " (unimplemented for this shape or data type)"
                     : ver->cpu_runtime == 0x200 ? " (a SYCL CPU runtime: no SYCL CPU device here?)" : "");
            impls[IDX].skip = mb_dnnl_why;
        } else {
            mb_dnnl_args[0].arg = 1; mb_dnnl_args[0].memory = ms;
            mb_dnnl_args[1].arg = 17; mb_dnnl_args[1].memory = md;
        }
    }
