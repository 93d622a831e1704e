/* Vulkan devices: the loader opened at run time (never linked), an instance made for the
 * question and destroyed after it, and each physical device's name, driver, memory (with its
 * measured budget where VK_EXT_memory_budget is there), limits and the shader features the
 * backend can use. No loader or no driver is not an error of this library: it reports
 * EI_ERR_UNSUPPORTED with the reason, which Python shows as "no GPU". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
#else
#include <dlfcn.h>
#endif

#include "vk_internal.h"

typedef struct {
    void *library;
    ei_vk_get_instance_proc_addr_fn get_proc;
    char path[256];
} vk_loader;

static vk_loader g_loader; /* opened once and kept (unloading a driver mid-process is unsafe); callers
                           * take turns: edgeinfer/_native.py holds a lock around ei_vk_devices */

static void *open_library(const char *name) {
#if defined(_WIN32)
    return (void *)LoadLibraryA(name);
#else
    return dlopen(name, RTLD_NOW | RTLD_LOCAL);
#endif
}

static void *library_symbol(void *library, const char *name) {
#if defined(_WIN32)
    return (void *)GetProcAddress((HMODULE)library, name);
#else
    return dlsym(library, name);
#endif
}

ei_status ei_vk_loader_open(void) {
    if (g_loader.get_proc) return EI_OK;
    const char *given = getenv("EDGEINFER_VULKAN_LOADER");
#if defined(_WIN32)
    static const char *const names[] = {"vulkan-1.dll", NULL};
#elif defined(__APPLE__)
    static const char *const names[] = {"libvulkan.1.dylib", "libvulkan.dylib", "libMoltenVK.dylib", NULL};
#else
    static const char *const names[] = {"libvulkan.so.1", "libvulkan.so", NULL};
#endif
    const char *const one[] = {given, NULL};
    const char *const *list = given && *given ? one : names;
    for (int i = 0; list[i]; i++) {
        void *lib = open_library(list[i]);
        if (!lib) continue;
        ei_vk_get_instance_proc_addr_fn get = (ei_vk_get_instance_proc_addr_fn)(uintptr_t)library_symbol(lib, "vkGetInstanceProcAddr");
        if (!get) continue;
        g_loader.library = lib;
        snprintf(g_loader.path, sizeof g_loader.path, "%s", list[i]);
        g_loader.get_proc = get;
        return EI_OK;
    }
    return ei_fail(EI_ERR_UNSUPPORTED, "no Vulkan loader: %s cannot be opened", list[0]);
}

ei_vk_void_fn ei_vk_instance_proc(ei_vk_instance inst, const char *name) { return g_loader.get_proc(inst, name); }

#define VK_FN(instance, type, name) ((type)(uintptr_t)ei_vk_instance_proc(instance, name))

static int has_extension(const ei_vk_extension *ext, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(ext[i].name, name)) return 1;
    return 0;
}

/* the device's extensions (a malloc'd array, *n of them; NULL with *n = 0 when none or on failure) */
static ei_vk_extension *device_extensions(ei_vk_instance inst, ei_vk_physical dev, uint32_t *n) {
    ei_vk_enumerate_device_extensions_fn list = VK_FN(inst, ei_vk_enumerate_device_extensions_fn, "vkEnumerateDeviceExtensionProperties");
    *n = 0;
    if (!list || list(dev, NULL, n, NULL) != 0 || *n == 0) return NULL;
    ei_vk_extension *ext = calloc(*n, sizeof *ext);
    if (!ext || list(dev, NULL, n, ext) < 0) {
        free(ext);
        *n = 0;
        return NULL;
    }
    return ext;
}

/* what the device has beyond Vulkan 1.0, each a structure it may be asked to fill */
typedef struct {
    int v11, driver, budget, f16_int8, dot;
} vk_has;

static vk_has device_has(uint32_t api, const ei_vk_extension *ext, uint32_t n) {
    const int v12 = api >= EI_VK_MAKE_API_VERSION(1, 2, 0), v13 = api >= EI_VK_MAKE_API_VERSION(1, 3, 0);
    return (vk_has){
        .v11 = api >= EI_VK_MAKE_API_VERSION(1, 1, 0),
        .driver = v12 || has_extension(ext, n, "VK_KHR_driver_properties"),
        .budget = has_extension(ext, n, "VK_EXT_memory_budget"),
        .f16_int8 = v12 || has_extension(ext, n, "VK_KHR_shader_float16_int8"),
        .dot = v13 || has_extension(ext, n, "VK_KHR_shader_integer_dot_product"),
    };
}

/* the device's properties, with the structures in has chained; NULL when out of memory */
static ei_vk_properties2 *get_properties(ei_vk_instance inst, ei_vk_physical dev, void *chain) {
    ei_vk_get_properties2_fn get = VK_FN(inst, ei_vk_get_properties2_fn, "vkGetPhysicalDeviceProperties2");
    ei_vk_properties2 *p = calloc(1, sizeof *p); /* (EI_VK_PROPERTIES_ROOM and more: not on the stack) */
    if (!p || !get) {
        free(p);
        return NULL;
    }
    p->s_type = EI_VK_ST_PROPERTIES_2;
    p->next = chain;
    get(dev, p);
    return p;
}

static void describe_properties(ei_vk_instance inst, ei_vk_physical dev, vk_has has, ei_vk_device *d) {
    ei_vk_driver_properties driver = {EI_VK_ST_DRIVER_PROPERTIES, NULL, 0, {0}, {0}, {0}};
    ei_vk_subgroup_properties subgroup = {EI_VK_ST_SUBGROUP_PROPERTIES, NULL, 0, 0, 0, 0};
    ei_vk_maintenance3_properties m3 = {EI_VK_ST_MAINTENANCE_3_PROPERTIES, NULL, 0, 0};
    void *chain = NULL;
    if (has.driver) driver.next = chain, chain = &driver;
    if (has.v11) m3.next = chain, subgroup.next = &m3, chain = &subgroup;
    ei_vk_properties2 *p = get_properties(inst, dev, chain);
    if (!p) return;
    const ei_vk_properties *q = &p->properties;
    snprintf(d->name, sizeof d->name, "%s", q->device_name);
    d->type = q->device_type;
    d->api_version = q->api_version;
    d->driver_version = q->driver_version;
    d->vendor_id = q->vendor_id;
    d->device_id = q->device_id;
    d->max_storage_buffer_range = q->max_storage_buffer_range;
    d->subgroup_size = subgroup.subgroup_size;
    d->subgroup_ops = (subgroup.supported_stages & 0x20u) ? subgroup.supported_operations : 0; /* compute stage */
    d->max_allocation_bytes = m3.max_memory_allocation_size;
    snprintf(d->driver_name, sizeof d->driver_name, "%s", driver.driver_name);
    snprintf(d->driver_info, sizeof d->driver_info, "%s", driver.driver_info);
    free(p);
}

ei_status ei_vk_check_limits(ei_vk_instance inst, ei_vk_physical dev, uint32_t bindings, uint32_t push_bytes) {
    ei_vk_properties2 *p = get_properties(inst, dev, NULL);
    if (!p) return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan: the device's properties cannot be read");
    const ei_vk_properties *q = &p->properties;
    ei_status st = EI_OK;
    if (q->max_per_stage_storage_buffers < bindings || q->max_push_constants_size < push_bytes)
        st = ei_fail(EI_ERR_UNSUPPORTED, "Vulkan: %s allows %u storage buffers and %u bytes of push constants a shader; the "
                     "offload's shaders need %u and %u", q->device_name, q->max_per_stage_storage_buffers,
                     q->max_push_constants_size, bindings, push_bytes);
    free(p);
    return st;
}

static void describe_memory(ei_vk_instance inst, ei_vk_physical dev, int budget_ext, ei_vk_device *d) {
    ei_vk_memory_budget budget;
    ei_vk_memory_properties2 mem;
    memset(&budget, 0, sizeof budget);
    memset(&mem, 0, sizeof mem);
    budget.s_type = EI_VK_ST_MEMORY_BUDGET_PROPERTIES;
    mem.s_type = EI_VK_ST_MEMORY_PROPERTIES_2;
    mem.next = budget_ext ? &budget : NULL;
    ei_vk_get_memory_properties2_fn get = VK_FN(inst, ei_vk_get_memory_properties2_fn, "vkGetPhysicalDeviceMemoryProperties2");
    if (!get) return;
    get(dev, &mem);
    for (uint32_t h = 0; h < mem.memory.heap_count && h < EI_VK_MAX_MEMORY_HEAPS; h++) {
        if (!(mem.memory.heaps[h].flags & EI_VK_MEMORY_HEAP_DEVICE_LOCAL)) continue;
        d->device_local_bytes += mem.memory.heaps[h].size;
        if (budget_ext && budget.heap_budget[h] > budget.heap_usage[h]) d->budget_bytes += budget.heap_budget[h] - budget.heap_usage[h];
    }
    d->memory_budget = budget_ext;
}

static void describe_features(ei_vk_instance inst, ei_vk_physical dev, vk_has has, ei_vk_device *d) {
    ei_vk_float16_int8_features f16i8 = {EI_VK_ST_FLOAT16_INT8_FEATURES, NULL, 0, 0};
    ei_vk_16bit_storage_features s16 = {EI_VK_ST_16BIT_STORAGE_FEATURES, NULL, 0, 0, 0, 0};
    ei_vk_integer_dot_product_features dot = {EI_VK_ST_INTEGER_DOT_PRODUCT_FEATURES, NULL, 0};
    ei_vk_features2 f;
    memset(&f, 0, sizeof f);
    f.s_type = EI_VK_ST_FEATURES_2;
    if (has.dot) dot.next = f.next, f.next = &dot;
    if (has.f16_int8) f16i8.next = f.next, f.next = &f16i8;
    if (has.v11) s16.next = f.next, f.next = &s16;
    ei_vk_get_features2_fn get = VK_FN(inst, ei_vk_get_features2_fn, "vkGetPhysicalDeviceFeatures2");
    if (!get) return;
    get(dev, &f);
    d->fp16 = (int32_t)f16i8.shader_float16;
    d->int8 = (int32_t)f16i8.shader_int8;
    d->storage16 = (int32_t)s16.storage_buffer_16bit_access;
    d->integer_dot_product = (int32_t)dot.shader_integer_dot_product;
}

static int instance_has_extension(const char *name) {
    ei_vk_enumerate_instance_extensions_fn list =
        VK_FN(NULL, ei_vk_enumerate_instance_extensions_fn, "vkEnumerateInstanceExtensionProperties");
    uint32_t n = 0;
    if (!list || list(NULL, &n, NULL) != 0 || n == 0) return 0;
    ei_vk_extension *ext = calloc(n, sizeof *ext);
    const int found = ext && list(NULL, &n, ext) >= 0 && has_extension(ext, n, name);
    free(ext);
    return found;
}

ei_status ei_vk_instance_create(ei_vk_instance *inst) {
    ei_vk_enumerate_instance_version_fn version = VK_FN(NULL, ei_vk_enumerate_instance_version_fn, "vkEnumerateInstanceVersion");
    ei_vk_create_instance_fn create = VK_FN(NULL, ei_vk_create_instance_fn, "vkCreateInstance");
    uint32_t have = EI_VK_MAKE_API_VERSION(1, 0, 0);
    if (version && version(&have) != 0) have = EI_VK_MAKE_API_VERSION(1, 0, 0);
    if (!create || have < EI_VK_MAKE_API_VERSION(1, 1, 0))
        return ei_fail(EI_ERR_UNSUPPORTED, "the Vulkan loader %s offers Vulkan %u.%u; 1.1 is needed", g_loader.path, have >> 22,
                       (have >> 12) & 0x3ffu);
    const ei_vk_application_info app = {EI_VK_ST_APPLICATION_INFO, NULL, "edgeinfer", 1, "edgeinfer", 1,
                                        have < EI_VK_MAKE_API_VERSION(1, 3, 0) ? have : EI_VK_MAKE_API_VERSION(1, 3, 0)};
    /* loaders since 1.3.216 list portability drivers (MoltenVK on Apple GPUs) only when asked */
    const char *const portability[] = {"VK_KHR_portability_enumeration"};
    const int asked = instance_has_extension(portability[0]);
    const ei_vk_instance_create_info info = {EI_VK_ST_INSTANCE_CREATE_INFO, NULL, asked ? EI_VK_INSTANCE_ENUMERATE_PORTABILITY : 0,
                                             &app, 0, NULL, asked ? 1u : 0u, asked ? portability : NULL};
    const ei_vk_result r = create(&info, NULL, inst);
    if (r != 0) return ei_fail(EI_ERR_UNSUPPORTED, "no Vulkan driver: vkCreateInstance returned %d (loader %s)", (int)r, g_loader.path);
    return EI_OK;
}

void ei_vk_describe(ei_vk_instance inst, ei_vk_physical dev, ei_vk_device *d) {
    memset(d, 0, sizeof *d);
    uint32_t n_ext = 0;
    ei_vk_extension *ext = device_extensions(inst, dev, &n_ext);
    ei_vk_properties2 *core = get_properties(inst, dev, NULL); /* its version says what is core */
    const vk_has has = device_has(core ? core->properties.api_version : 0, ext, n_ext);
    free(core);
    describe_properties(inst, dev, has, d);
    describe_memory(inst, dev, has.budget, d);
    describe_features(inst, dev, has, d);
    free(ext);
}

ei_status ei_vk_devices(ei_vk_device *out, int32_t cap, int32_t *count) {
    if (!count || cap < 0 || (cap > 0 && !out)) return ei_fail(EI_ERR_INVALID, "ei_vk_devices: bad arguments");
    *count = 0;
    ei_status st = ei_vk_loader_open();
    ei_vk_instance inst = NULL;
    if (st == EI_OK) st = ei_vk_instance_create(&inst);
    if (st != EI_OK) return st;
    ei_vk_enumerate_physical_devices_fn enumerate = VK_FN(inst, ei_vk_enumerate_physical_devices_fn, "vkEnumeratePhysicalDevices");
    ei_vk_destroy_instance_fn destroy = VK_FN(inst, ei_vk_destroy_instance_fn, "vkDestroyInstance");
    uint32_t n = 0;
    ei_vk_physical *devs = NULL;
    if (enumerate && enumerate(inst, &n, NULL) == 0 && n > 0) {
        devs = calloc(n, sizeof *devs);
        if (!devs || enumerate(inst, &n, devs) < 0) n = 0;
    }
    for (uint32_t i = 0; i < n && (int32_t)i < cap; i++) ei_vk_describe(inst, devs[i], &out[i]);
    *count = (int32_t)n;
    free(devs);
    if (destroy) destroy(inst, NULL);
    return EI_OK;
}
