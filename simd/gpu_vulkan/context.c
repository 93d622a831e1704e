/* The Vulkan compute context: one device and its compute queue, one pipeline layout shared by
 * every shader (EI_VK_BINDINGS storage buffers, EI_VK_PUSH_BYTES of push constants), pipelines
 * made on first use from the SPIR-V compiled into the library, buffers, and one command buffer
 * that records dispatches until ei_vk_submit runs them and waits. A context is used by one
 * thread at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

#define VK_FN(inst, type, name) ((type)(uintptr_t)ei_vk_instance_proc(inst, name))
#define SUBGROUP_BASIC 0x1u
#define SUBGROUP_SHUFFLE 0x10u

static ei_status vk_error(ei_vk_result r, const char *what) {
    if (r == EI_VK_ERROR_OUT_OF_DEVICE_MEMORY || r == EI_VK_ERROR_OUT_OF_HOST_MEMORY)
        return ei_fail(EI_ERR_NOMEM, "Vulkan: %s ran out of %s memory", what, r == EI_VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host");
    return ei_fail(EI_ERR_DEVICE, "Vulkan: %s failed (VkResult %d)", what, (int)r);
}

static ei_status pick_device(ei_vk_context *ctx, int32_t index) {
    ei_vk_enumerate_physical_devices_fn enumerate =
        VK_FN(ctx->instance, ei_vk_enumerate_physical_devices_fn, "vkEnumeratePhysicalDevices");
    uint32_t n = 0;
    if (!enumerate || enumerate(ctx->instance, &n, NULL) != 0 || n == 0)
        return ei_fail(EI_ERR_UNSUPPORTED, "no GPU: the Vulkan loader lists no device");
    ei_vk_physical *devs = calloc(n, sizeof *devs);
    if (!devs) return ei_fail(EI_ERR_NOMEM, "Vulkan: out of memory listing devices");
    if (enumerate(ctx->instance, &n, devs) < 0) n = 0;
    if (index >= (int32_t)n || n == 0) {
        free(devs);
        return ei_fail(EI_ERR_INVALID, "Vulkan device %d asked for; there are %u", (int)index, n);
    }
    if (index < 0) { /* the first discrete GPU, else the first integrated one, else the first device */
        static const int32_t rank[] = {3, 1, 2, 4, 0}; /* by VkPhysicalDeviceType: lower is better */
        int32_t best = 99;
        for (uint32_t i = 0; i < n; i++) {
            ei_vk_device d;
            ei_vk_describe(ctx->instance, devs[i], &d);
            const int32_t r = d.type >= 0 && d.type <= 4 ? rank[d.type] : 5;
            if (r < best) best = r, index = (int32_t)i;
        }
    }
    ctx->physical = devs[index];
    ctx->index = index;
    free(devs);
    ei_vk_describe(ctx->instance, ctx->physical, &ctx->info);
    return EI_OK;
}

static ei_status create_device(ei_vk_context *ctx) {
    ei_vk_get_queue_families_fn families = VK_FN(ctx->instance, ei_vk_get_queue_families_fn, "vkGetPhysicalDeviceQueueFamilyProperties");
    ei_vk_create_device_fn create = VK_FN(ctx->instance, ei_vk_create_device_fn, "vkCreateDevice");
    ei_vk_get_device_proc_addr_fn proc = VK_FN(ctx->instance, ei_vk_get_device_proc_addr_fn, "vkGetDeviceProcAddr");
    ei_vk_get_memory_properties2_fn memory = VK_FN(ctx->instance, ei_vk_get_memory_properties2_fn, "vkGetPhysicalDeviceMemoryProperties2");
    if (!families || !create || !proc || !memory) return ei_fail(EI_ERR_UNSUPPORTED, "no GPU: the Vulkan loader lacks device functions");
    ei_vk_queue_family fam[16];
    uint32_t n = 16, family = UINT32_MAX;
    families(ctx->physical, &n, fam);
    for (uint32_t i = 0; i < n && family == UINT32_MAX; i++)
        if (fam[i].flags & EI_VK_QUEUE_COMPUTE) family = i;
    if (family == UINT32_MAX) return ei_fail(EI_ERR_UNSUPPORTED, "no GPU: %s has no compute queue", ctx->info.name);
    const float priority = 1.0f;
    const ei_vk_queue_create_info queue = {EI_VK_ST_DEVICE_QUEUE_CREATE_INFO, NULL, 0, family, 1, &priority};
    /* the integer dot product where the device has it (Vulkan 1.3, or its KHR extension),
     * unless EDGEINFER_VULKAN_INTEGER_DOT=0 asks for the shaders' fallback */
    const char *dot_env = getenv("EDGEINFER_VULKAN_INTEGER_DOT");
    ctx->int_dot = ctx->info.integer_dot_product && !(dot_env && !strcmp(dot_env, "0"));
    ei_vk_integer_dot_product_features dot = {EI_VK_ST_INTEGER_DOT_PRODUCT_FEATURES, NULL, 1};
    const char *dot_ext[1] = {"VK_KHR_shader_integer_dot_product"};
    const int need_ext = ctx->int_dot && ctx->info.api_version < EI_VK_MAKE_API_VERSION(1, 3, 0);
    const ei_vk_device_create_info info = {EI_VK_ST_DEVICE_CREATE_INFO, ctx->int_dot ? &dot : NULL, 0, 1, &queue, 0, NULL,
                                           need_ext ? 1u : 0u, need_ext ? dot_ext : NULL, NULL};
    ei_vk_result r = create(ctx->physical, &info, NULL, &ctx->device);
    if (r != 0) return vk_error(r, "vkCreateDevice");
#define EI_VK_FN_LOAD(name, ret, args)                                                   \
    ctx->fn.name = (ret(EI_VKAPI *) args)(uintptr_t)proc(ctx->device, "vk" #name);        \
    if (!ctx->fn.name) return ei_fail(EI_ERR_UNSUPPORTED, "no GPU: the driver lacks vk%s", #name);
    EI_VK_DEVICE_FUNCTIONS(EI_VK_FN_LOAD)
#undef EI_VK_FN_LOAD
    ctx->fn.GetDeviceQueue(ctx->device, family, 0, &ctx->queue);
    ei_vk_memory_properties2 mem;
    memset(&mem, 0, sizeof mem);
    mem.s_type = EI_VK_ST_MEMORY_PROPERTIES_2;
    memory(ctx->physical, &mem);
    ctx->memory = mem.memory;
    const ei_vk_command_pool_create_info pool = {EI_VK_ST_COMMAND_POOL_CREATE_INFO, NULL, EI_VK_COMMAND_POOL_RESET_BUFFER, family};
    if ((r = ctx->fn.CreateCommandPool(ctx->device, &pool, NULL, &ctx->command_pool)) != 0) return vk_error(r, "vkCreateCommandPool");
    const ei_vk_command_buffer_allocate_info cmd = {EI_VK_ST_COMMAND_BUFFER_ALLOCATE_INFO, NULL, ctx->command_pool, 0, 1};
    if ((r = ctx->fn.AllocateCommandBuffers(ctx->device, &cmd, &ctx->cmd)) != 0) return vk_error(r, "vkAllocateCommandBuffers");
    const ei_vk_fence_create_info fence = {EI_VK_ST_FENCE_CREATE_INFO, NULL, 0};
    if ((r = ctx->fn.CreateFence(ctx->device, &fence, NULL, &ctx->fence)) != 0) return vk_error(r, "vkCreateFence");
    return EI_OK;
}

static ei_status create_layouts(ei_vk_context *ctx) {
    ei_vk_descriptor_binding b[EI_VK_BINDINGS];
    for (uint32_t i = 0; i < EI_VK_BINDINGS; i++)
        b[i] = (ei_vk_descriptor_binding){i, EI_VK_DESCRIPTOR_STORAGE_BUFFER, 1, EI_VK_SHADER_STAGE_COMPUTE, NULL};
    const ei_vk_descriptor_layout_create_info set = {EI_VK_ST_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, NULL, 0, EI_VK_BINDINGS, b};
    ei_vk_result r = ctx->fn.CreateDescriptorSetLayout(ctx->device, &set, NULL, &ctx->set_layout);
    if (r != 0) return vk_error(r, "vkCreateDescriptorSetLayout");
    const ei_vk_push_range push = {EI_VK_SHADER_STAGE_COMPUTE, 0, EI_VK_PUSH_BYTES};
    const ei_vk_pipeline_layout_create_info layout = {EI_VK_ST_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 1, &ctx->set_layout, 1, &push};
    if ((r = ctx->fn.CreatePipelineLayout(ctx->device, &layout, NULL, &ctx->pipeline_layout)) != 0) return vk_error(r, "vkCreatePipelineLayout");
    const ei_vk_descriptor_pool_size size = {EI_VK_DESCRIPTOR_STORAGE_BUFFER, EI_VK_POOL_SETS * EI_VK_BINDINGS};
    const ei_vk_descriptor_pool_create_info pool = {EI_VK_ST_DESCRIPTOR_POOL_CREATE_INFO, NULL, 0, EI_VK_POOL_SETS, 1, &size};
    if ((r = ctx->fn.CreateDescriptorPool(ctx->device, &pool, NULL, &ctx->descriptor_pool)) != 0) return vk_error(r, "vkCreateDescriptorPool");
    ctx->pipelines = calloc((size_t)ei_vk_n_shaders, sizeof *ctx->pipelines);
    return ctx->pipelines ? EI_OK : ei_fail(EI_ERR_NOMEM, "Vulkan: out of memory for pipelines");
}

ei_status ei_vk_context_open(int32_t device_index, ei_vk_context **out) {
    if (!out) return ei_fail(EI_ERR_INVALID, "ei_vk_context_open: no output");
    *out = NULL;
    ei_status st = ei_vk_loader_open();
    if (st != EI_OK) return st;
    ei_vk_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return ei_fail(EI_ERR_NOMEM, "Vulkan: out of memory for a context");
    st = ei_vk_instance_create(&ctx->instance);
    if (st == EI_OK) st = pick_device(ctx, device_index);
    if (st == EI_OK) st = ei_vk_check_limits(ctx->instance, ctx->physical, EI_VK_BINDINGS, EI_VK_PUSH_BYTES);
    if (st == EI_OK) st = create_device(ctx);
    if (st == EI_OK) st = create_layouts(ctx);
    if (st != EI_OK) {
        ei_vk_context_close(ctx);
        return st;
    }
    const char *sg = getenv("EDGEINFER_VULKAN_SUBGROUPS"); /* "0": the shared-memory variants, as on devices without */
    const uint32_t need = SUBGROUP_BASIC | SUBGROUP_SHUFFLE; /* the products' butterfly (reduce.glsl) */
    /* whole subgroups of 4 to 64 lanes in the products' workgroups of 64: every lane a shuffle reads is active */
    ctx->subgroups = (ctx->info.subgroup_ops & need) == need && ctx->info.subgroup_size >= 4 && ctx->info.subgroup_size <= 64 &&
                     !(sg && !strcmp(sg, "0"));
    ctx->max_binding_bytes = ctx->info.max_storage_buffer_range;
    if (ctx->info.max_allocation_bytes && ctx->info.max_allocation_bytes < ctx->max_binding_bytes)
        ctx->max_binding_bytes = ctx->info.max_allocation_bytes;
    ctx->weight_part_bytes = ctx->max_binding_bytes;
    const char *cap = getenv("EDGEINFER_VULKAN_MAX_BUFFER"); /* smaller weight parts, to test the splitting of large tensors */
    if (cap && strtoull(cap, NULL, 10) >= 4096 && strtoull(cap, NULL, 10) < ctx->weight_part_bytes)
        ctx->weight_part_bytes = strtoull(cap, NULL, 10);
    *out = ctx;
    return EI_OK;
}

void ei_vk_context_close(ei_vk_context *ctx) {
    if (!ctx) return;
    if (ctx->device) {
        ctx->fn.DeviceWaitIdle(ctx->device);
        ei_vk_buffer_free(ctx, &ctx->staging);
        for (int i = 0; ctx->pipelines && i < ei_vk_n_shaders; i++)
            if (ctx->pipelines[i]) ctx->fn.DestroyPipeline(ctx->device, ctx->pipelines[i], NULL);
        if (ctx->descriptor_pool) ctx->fn.DestroyDescriptorPool(ctx->device, ctx->descriptor_pool, NULL);
        if (ctx->pipeline_layout) ctx->fn.DestroyPipelineLayout(ctx->device, ctx->pipeline_layout, NULL);
        if (ctx->set_layout) ctx->fn.DestroyDescriptorSetLayout(ctx->device, ctx->set_layout, NULL);
        if (ctx->fence) ctx->fn.DestroyFence(ctx->device, ctx->fence, NULL);
        if (ctx->command_pool) ctx->fn.DestroyCommandPool(ctx->device, ctx->command_pool, NULL);
        ctx->fn.DestroyDevice(ctx->device, NULL);
    }
    if (ctx->instance) {
        ei_vk_destroy_instance_fn destroy = VK_FN(ctx->instance, ei_vk_destroy_instance_fn, "vkDestroyInstance");
        if (destroy) destroy(ctx->instance, NULL);
    }
    free(ctx->pipelines);
    free(ctx);
}

/* the first memory type allowed by bits with every flag of need, preferring those with want */
static int memory_type(const ei_vk_context *ctx, uint32_t bits, uint32_t need, uint32_t want) {
    int fallback = -1;
    for (uint32_t i = 0; i < ctx->memory.type_count; i++) {
        const uint32_t f = ctx->memory.types[i].property_flags;
        if (!(bits >> i & 1u) || (f & need) != need) continue;
        if ((f & want) == want) return (int)i;
        if (fallback < 0) fallback = (int)i;
    }
    return fallback;
}

ei_status ei_vk_buffer_alloc(ei_vk_context *ctx, uint64_t bytes, int host_visible, ei_vk_buffer *out) {
    memset(out, 0, sizeof *out);
    if (bytes == 0) bytes = 4;
    if (ctx->info.max_allocation_bytes && bytes > ctx->info.max_allocation_bytes)
        return ei_fail(EI_ERR_NOMEM, "Vulkan: a buffer of %llu bytes is over %s's largest allocation (%llu bytes)",
                       (unsigned long long)bytes, ctx->info.name, (unsigned long long)ctx->info.max_allocation_bytes);
    const ei_vk_buffer_create_info info = {EI_VK_ST_BUFFER_CREATE_INFO, NULL, 0, bytes,
                                           EI_VK_BUFFER_STORAGE | EI_VK_BUFFER_TRANSFER_SRC | EI_VK_BUFFER_TRANSFER_DST, 0, 0, NULL};
    ei_vk_result r = ctx->fn.CreateBuffer(ctx->device, &info, NULL, &out->buffer);
    if (r != 0) return vk_error(r, "vkCreateBuffer");
    ei_vk_memory_requirements req;
    ctx->fn.GetBufferMemoryRequirements(ctx->device, out->buffer, &req);
    const uint32_t coherent = EI_VK_MEMORY_HOST_VISIBLE | EI_VK_MEMORY_HOST_COHERENT;
    const int type = host_visible ? memory_type(ctx, req.type_bits, coherent, EI_VK_MEMORY_HOST_CACHED)
                                  : memory_type(ctx, req.type_bits, EI_VK_MEMORY_DEVICE_LOCAL, coherent);
    if (type < 0) {
        ei_vk_buffer_free(ctx, out);
        return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan: %s has no %s memory for storage buffers", ctx->info.name,
                       host_visible ? "host-visible" : "device-local");
    }
    if (ctx->dry_run) { /* measured, not made: the size stays for the callers' limit checks */
        ctx->fn.DestroyBuffer(ctx->device, out->buffer, NULL);
        out->buffer = 0;
        out->bytes = bytes;
        ctx->dry_bytes += req.size;
        if ((ctx->memory.types[type].property_flags & coherent) != coherent) ctx->dry_staged = 1;
        return EI_OK;
    }
    const ei_vk_memory_allocate_info alloc = {EI_VK_ST_MEMORY_ALLOCATE_INFO, NULL, req.size, (uint32_t)type};
    if ((r = ctx->fn.AllocateMemory(ctx->device, &alloc, NULL, &out->memory)) != 0) {
        ei_vk_buffer_free(ctx, out);
        if (r == EI_VK_ERROR_OUT_OF_DEVICE_MEMORY || r == EI_VK_ERROR_OUT_OF_HOST_MEMORY)
            return ei_fail(EI_ERR_NOMEM, "Vulkan: %s cannot allocate %llu more bytes (%llu held by edgeinfer)", ctx->info.name,
                           (unsigned long long)req.size, (unsigned long long)ctx->allocated_bytes);
        return vk_error(r, "vkAllocateMemory");
    }
    out->bytes = bytes;
    if ((r = ctx->fn.BindBufferMemory(ctx->device, out->buffer, out->memory, 0)) != 0) {
        ei_vk_buffer_free(ctx, out);
        return vk_error(r, "vkBindBufferMemory");
    }
    const uint32_t flags = ctx->memory.types[type].property_flags;
    if ((flags & coherent) == coherent && (r = ctx->fn.MapMemory(ctx->device, out->memory, 0, ~0ull, 0, &out->mapped)) != 0) {
        ei_vk_buffer_free(ctx, out);
        return vk_error(r, "vkMapMemory");
    }
    out->allocated = req.size;
    ctx->allocated_bytes += req.size;
    return EI_OK;
}

uint64_t ei_vk_held_bytes(const ei_vk_context *ctx) { return ctx->dry_run ? ctx->dry_bytes : ctx->allocated_bytes; }

void ei_vk_buffer_free(ei_vk_context *ctx, ei_vk_buffer *buf) {
    if (!buf || !ctx->device) return;
    if (buf->buffer) ctx->fn.DestroyBuffer(ctx->device, buf->buffer, NULL);
    if (buf->memory) ctx->fn.FreeMemory(ctx->device, buf->memory, NULL); /* unmaps it too */
    ctx->allocated_bytes -= buf->allocated;
    memset(buf, 0, sizeof *buf);
}

static ei_status begin(ei_vk_context *ctx) {
    if (ctx->recording) return EI_OK;
    const ei_vk_command_buffer_begin_info info = {EI_VK_ST_COMMAND_BUFFER_BEGIN_INFO, NULL, EI_VK_COMMAND_BUFFER_ONE_TIME, NULL};
    const ei_vk_result r = ctx->fn.BeginCommandBuffer(ctx->cmd, &info);
    if (r != 0) return vk_error(r, "vkBeginCommandBuffer");
    ctx->recording = 1;
    return EI_OK;
}

ei_status ei_vk_submit(ei_vk_context *ctx) {
    if (!ctx->recording) return EI_OK;
    ctx->recording = 0;
    /* the host reads what the shaders and copies wrote */
    const ei_vk_memory_barrier host = {EI_VK_ST_MEMORY_BARRIER, NULL, EI_VK_ACCESS_SHADER_WRITE | EI_VK_ACCESS_TRANSFER_WRITE,
                                       EI_VK_ACCESS_HOST_READ};
    ctx->fn.CmdPipelineBarrier(ctx->cmd, EI_VK_STAGE_COMPUTE | EI_VK_STAGE_TRANSFER, EI_VK_STAGE_HOST, 0, 1, &host, 0, NULL, 0, NULL);
    ei_vk_result r = ctx->fn.EndCommandBuffer(ctx->cmd);
    const ei_vk_submit_info submit = {EI_VK_ST_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &ctx->cmd, 0, NULL};
    if (r == 0) r = ctx->fn.QueueSubmit(ctx->queue, 1, &submit, ctx->fence);
    if (r == 0) r = ctx->fn.WaitForFences(ctx->device, 1, &ctx->fence, 1, ~0ull);
    const ei_vk_result reset = ctx->fn.ResetFences(ctx->device, 1, &ctx->fence);
    ctx->fn.ResetCommandBuffer(ctx->cmd, 0);
    ctx->fn.ResetDescriptorPool(ctx->device, ctx->descriptor_pool, 0);
    ctx->sets_used = 0;
    if (r != 0) return vk_error(r, "running the recorded work");
    return reset != 0 ? vk_error(reset, "vkResetFences") : EI_OK;
}

void ei_vk_discard(ei_vk_context *ctx) {
    if (!ctx->recording) return;
    ctx->recording = 0;
    ctx->fn.EndCommandBuffer(ctx->cmd);
    ctx->fn.ResetCommandBuffer(ctx->cmd, 0);
    ctx->fn.ResetDescriptorPool(ctx->device, ctx->descriptor_pool, 0);
    ctx->sets_used = 0;
}

/* one copy between buffers, recorded, run and waited for */
static ei_status copy_now(ei_vk_context *ctx, ei_vk_buffer *src, uint64_t src_off, ei_vk_buffer *dst, uint64_t dst_off, uint64_t bytes) {
    if (ctx->recording) return ei_fail(EI_ERR_INVALID, "Vulkan: a staged copy while dispatches are recorded");
    ei_status st = begin(ctx);
    if (st != EI_OK) return st;
    const ei_vk_buffer_copy region = {src_off, dst_off, bytes};
    ctx->fn.CmdCopyBuffer(ctx->cmd, src->buffer, dst->buffer, 1, &region);
    return ei_vk_submit(ctx);
}

static ei_status staging_for(ei_vk_context *ctx, uint64_t bytes) {
    if (ctx->staging.bytes >= bytes) return EI_OK;
    ei_vk_buffer_free(ctx, &ctx->staging);
    return ei_vk_buffer_alloc(ctx, bytes, 1, &ctx->staging);
}

#define STAGING_CHUNK (16ull << 20)

uint64_t ei_vk_staging_bytes(void) { return STAGING_CHUNK; }

ei_status ei_vk_buffer_write(ei_vk_context *ctx, ei_vk_buffer *buf, uint64_t offset, const void *src, uint64_t bytes) {
    if (offset > buf->bytes || bytes > buf->bytes - offset) return ei_fail(EI_ERR_INVALID, "Vulkan: a write past a buffer's end");
    if (ctx->dry_run) return EI_OK;
    if (buf->mapped) {
        memcpy((char *)buf->mapped + offset, src, bytes);
        return EI_OK;
    }
    for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = bytes - done < STAGING_CHUNK ? bytes - done : STAGING_CHUNK;
        ei_status st = staging_for(ctx, n);
        if (st != EI_OK) return st;
        memcpy(ctx->staging.mapped, (const char *)src + done, n);
        if ((st = copy_now(ctx, &ctx->staging, 0, buf, offset + done, n)) != EI_OK) return st;
        done += n;
    }
    return EI_OK;
}

ei_status ei_vk_buffer_read(ei_vk_context *ctx, ei_vk_buffer *buf, uint64_t offset, void *dst, uint64_t bytes) {
    if (offset > buf->bytes || bytes > buf->bytes - offset) return ei_fail(EI_ERR_INVALID, "Vulkan: a read past a buffer's end");
    if (ctx->dry_run) return EI_OK;
    if (buf->mapped) {
        memcpy(dst, (const char *)buf->mapped + offset, bytes);
        return EI_OK;
    }
    for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = bytes - done < STAGING_CHUNK ? bytes - done : STAGING_CHUNK;
        ei_status st = staging_for(ctx, n);
        if (st == EI_OK) st = copy_now(ctx, buf, offset + done, &ctx->staging, 0, n);
        if (st != EI_OK) return st;
        memcpy((char *)dst + done, ctx->staging.mapped, n);
        done += n;
    }
    return EI_OK;
}

ei_status ei_vk_shader_index(const char *name, int *index) {
    for (int i = 0; i < ei_vk_n_shaders; i++)
        if (!strcmp(ei_vk_shaders[i].name, name)) {
            *index = i;
            return EI_OK;
        }
    return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan: no shader %s in this build", name);
}

static ei_status pipeline(ei_vk_context *ctx, int shader, ei_vk_handle *out) {
    if (ctx->pipelines[shader]) {
        *out = ctx->pipelines[shader];
        return EI_OK;
    }
    const ei_vk_spirv *s = &ei_vk_shaders[shader];
    const ei_vk_shader_module_create_info info = {EI_VK_ST_SHADER_MODULE_CREATE_INFO, NULL, 0, (size_t)s->n_words * 4, s->words};
    ei_vk_handle module = 0;
    ei_vk_result r = ctx->fn.CreateShaderModule(ctx->device, &info, NULL, &module);
    if (r != 0) return vk_error(r, "vkCreateShaderModule");
    const ei_vk_compute_pipeline_create_info p = {
        EI_VK_ST_COMPUTE_PIPELINE_CREATE_INFO, NULL, 0,
        {EI_VK_ST_PIPELINE_SHADER_STAGE_CREATE_INFO, NULL, 0, EI_VK_SHADER_STAGE_COMPUTE, module, "main", NULL},
        ctx->pipeline_layout, 0, -1};
    r = ctx->fn.CreateComputePipelines(ctx->device, 0, 1, &p, NULL, &ctx->pipelines[shader]);
    ctx->fn.DestroyShaderModule(ctx->device, module, NULL);
    if (r != 0) {
        ctx->pipelines[shader] = 0;
        return vk_error(r, s->name);
    }
    *out = ctx->pipelines[shader];
    return EI_OK;
}

ei_status ei_vk_dispatch(ei_vk_context *ctx, int shader, ei_vk_buffer *const *buffers, const void *push,
                         uint32_t push_bytes, uint32_t groups_x, uint32_t groups_y, uint32_t groups_z) {
    if (shader < 0 || shader >= ei_vk_n_shaders || !buffers || !buffers[0] || push_bytes > EI_VK_PUSH_BYTES ||
        groups_x > EI_VK_MAX_GROUPS || groups_y > EI_VK_MAX_GROUPS || groups_z > EI_VK_MAX_GROUPS)
        return ei_fail(EI_ERR_INVALID, "ei_vk_dispatch: bad arguments");
    if (groups_x == 0 || groups_y == 0 || groups_z == 0) return EI_OK;
    for (int i = 0; i < EI_VK_BINDINGS; i++) {
        const ei_vk_buffer *b = buffers[i] ? buffers[i] : buffers[0];
        if (b->bytes > ctx->max_binding_bytes)
            return ei_fail(EI_ERR_INVALID, "Vulkan: a binding of %llu bytes is over %s's limit of %llu",
                           (unsigned long long)b->bytes, ctx->info.name, (unsigned long long)ctx->max_binding_bytes);
    }
    ei_vk_handle pipe = 0;
    ei_status st = pipeline(ctx, shader, &pipe);
    if (st != EI_OK) return st;
    if (ctx->sets_used == EI_VK_POOL_SETS && (st = ei_vk_submit(ctx)) != EI_OK) return st;
    if ((st = begin(ctx)) != EI_OK) return st;
    ei_vk_handle set = 0;
    const ei_vk_descriptor_set_allocate_info alloc = {EI_VK_ST_DESCRIPTOR_SET_ALLOCATE_INFO, NULL, ctx->descriptor_pool, 1, &ctx->set_layout};
    ei_vk_result r = ctx->fn.AllocateDescriptorSets(ctx->device, &alloc, &set);
    if (r != 0) return vk_error(r, "vkAllocateDescriptorSets");
    ctx->sets_used++;
    ei_vk_descriptor_buffer_info info[EI_VK_BINDINGS];
    ei_vk_write_descriptor_set write[EI_VK_BINDINGS];
    for (uint32_t i = 0; i < EI_VK_BINDINGS; i++) {
        const ei_vk_buffer *b = buffers[i] ? buffers[i] : buffers[0];
        info[i] = (ei_vk_descriptor_buffer_info){b->buffer, 0, b->bytes};
        write[i] = (ei_vk_write_descriptor_set){EI_VK_ST_WRITE_DESCRIPTOR_SET, NULL, set, i, 0, 1, EI_VK_DESCRIPTOR_STORAGE_BUFFER, NULL, &info[i], NULL};
    }
    ctx->fn.UpdateDescriptorSets(ctx->device, EI_VK_BINDINGS, write, 0, NULL);
    /* each dispatch reads what the ones before it wrote (and what copies put there) */
    const ei_vk_memory_barrier before = {EI_VK_ST_MEMORY_BARRIER, NULL, EI_VK_ACCESS_SHADER_WRITE | EI_VK_ACCESS_TRANSFER_WRITE,
                                         EI_VK_ACCESS_SHADER_READ | EI_VK_ACCESS_SHADER_WRITE};
    ctx->fn.CmdPipelineBarrier(ctx->cmd, EI_VK_STAGE_COMPUTE | EI_VK_STAGE_TRANSFER, EI_VK_STAGE_COMPUTE, 0, 1, &before, 0, NULL, 0, NULL);
    ctx->fn.CmdBindPipeline(ctx->cmd, EI_VK_BIND_POINT_COMPUTE, pipe);
    ctx->fn.CmdBindDescriptorSets(ctx->cmd, EI_VK_BIND_POINT_COMPUTE, ctx->pipeline_layout, 0, 1, &set, 0, NULL);
    if (push_bytes) ctx->fn.CmdPushConstants(ctx->cmd, ctx->pipeline_layout, EI_VK_SHADER_STAGE_COMPUTE, 0, push_bytes, push);
    ctx->fn.CmdDispatch(ctx->cmd, groups_x, groups_y, groups_z);
    return EI_OK;
}

ei_status ei_vk_copy(ei_vk_context *ctx, ei_vk_buffer *src, ei_vk_buffer *dst, uint32_t n, const ei_vk_buffer_copy *regions) {
    if (n == 0) return EI_OK;
    for (uint32_t i = 0; i < n; i++)
        if (regions[i].src_offset + regions[i].size > src->bytes || regions[i].dst_offset + regions[i].size > dst->bytes)
            return ei_fail(EI_ERR_INVALID, "ei_vk_copy: a region past a buffer's end");
    ei_status st = begin(ctx);
    if (st != EI_OK) return st;
    const ei_vk_memory_barrier before = {EI_VK_ST_MEMORY_BARRIER, NULL, EI_VK_ACCESS_SHADER_WRITE | EI_VK_ACCESS_TRANSFER_WRITE,
                                         EI_VK_ACCESS_TRANSFER_READ | EI_VK_ACCESS_TRANSFER_WRITE};
    ctx->fn.CmdPipelineBarrier(ctx->cmd, EI_VK_STAGE_COMPUTE | EI_VK_STAGE_TRANSFER, EI_VK_STAGE_TRANSFER, 0, 1, &before, 0, NULL, 0, NULL);
    ctx->fn.CmdCopyBuffer(ctx->cmd, src->buffer, dst->buffer, n, regions);
    return EI_OK;
}
