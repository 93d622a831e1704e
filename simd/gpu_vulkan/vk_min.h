/* The part of the Vulkan API the backend calls, declared from the specification's layouts so
 * that the package builds with a C compiler alone (no Vulkan SDK or headers): libvulkan is
 * opened at run time. Only leading fields of the large structs are named; the rest is room
 * that the driver fills and we never read (VkPhysicalDeviceProperties is 824 bytes on LP64;
 * EI_VK_PROPERTIES_ROOM leaves it space to grow). */
#ifndef EI_VK_MIN_H
#define EI_VK_MIN_H

#include <stdint.h>

#if defined(_WIN32)
#define EI_VKAPI __stdcall
#else
#define EI_VKAPI
#endif

typedef int32_t ei_vk_result; /* VK_SUCCESS = 0, VK_INCOMPLETE = 5, errors negative */
typedef struct ei_vk_instance_t *ei_vk_instance;
typedef struct ei_vk_physical_t *ei_vk_physical;
typedef void (EI_VKAPI *ei_vk_void_fn)(void);

enum { /* VkStructureType values */
    EI_VK_ST_APPLICATION_INFO = 0,
    EI_VK_ST_INSTANCE_CREATE_INFO = 1,
    EI_VK_ST_FEATURES_2 = 1000059000,
    EI_VK_ST_PROPERTIES_2 = 1000059001,
    EI_VK_ST_MEMORY_PROPERTIES_2 = 1000059006,
    EI_VK_ST_FLOAT16_INT8_FEATURES = 1000082000,
    EI_VK_ST_16BIT_STORAGE_FEATURES = 1000083000,
    EI_VK_ST_SUBGROUP_PROPERTIES = 1000094000,
    EI_VK_ST_MAINTENANCE_3_PROPERTIES = 1000168000,
    EI_VK_ST_DRIVER_PROPERTIES = 1000196000,
    EI_VK_ST_MEMORY_BUDGET_PROPERTIES = 1000237000,
    EI_VK_ST_INTEGER_DOT_PRODUCT_FEATURES = 1000280000,
};

#define EI_VK_MAKE_API_VERSION(major, minor, patch) (((uint32_t)(major) << 22) | ((uint32_t)(minor) << 12) | (uint32_t)(patch))
#define EI_VK_MEMORY_HEAP_DEVICE_LOCAL 0x1u
#define EI_VK_INSTANCE_ENUMERATE_PORTABILITY 0x1u /* VK_KHR_portability_enumeration's instance flag */
#define EI_VK_MAX_MEMORY_TYPES 32
#define EI_VK_MAX_MEMORY_HEAPS 16

typedef struct { /* VkApplicationInfo */
    int32_t s_type;
    const void *next;
    const char *application_name;
    uint32_t application_version;
    const char *engine_name;
    uint32_t engine_version;
    uint32_t api_version;
} ei_vk_application_info;

typedef struct { /* VkInstanceCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags;
    const ei_vk_application_info *application;
    uint32_t layer_count;
    const char *const *layers;
    uint32_t extension_count;
    const char *const *extensions;
} ei_vk_instance_create_info;

typedef struct { /* VkExtensionProperties */
    char name[256];
    uint32_t spec_version;
} ei_vk_extension;

/* VkPhysicalDeviceProperties: the named head, then VkPhysicalDeviceLimits (8-aligned), whose
 * first eight fields are uint32_t, maxStorageBufferRange the eighth; then the rest */
#define EI_VK_PROPERTIES_ROOM 2048
typedef struct {
    uint32_t api_version, driver_version, vendor_id, device_id;
    int32_t device_type; /* 0 other, 1 integrated, 2 discrete, 3 virtual, 4 CPU */
    char device_name[256];
    uint8_t pipeline_cache_uuid[16];
    uint32_t pad; /* the limits start 8-aligned */
    uint32_t max_image_dimension[4], max_image_array_layers, max_texel_buffer_elements;
    uint32_t max_uniform_buffer_range, max_storage_buffer_range;
    uint8_t rest[EI_VK_PROPERTIES_ROOM];
} ei_vk_properties;

typedef struct { /* VkPhysicalDeviceProperties2 */
    int32_t s_type;
    void *next;
    ei_vk_properties properties;
} ei_vk_properties2;

typedef struct { /* VkPhysicalDeviceDriverProperties */
    int32_t s_type;
    void *next;
    int32_t driver_id;
    char driver_name[256];
    char driver_info[256];
    uint8_t conformance_version[4];
} ei_vk_driver_properties;

typedef struct { /* VkPhysicalDeviceSubgroupProperties */
    int32_t s_type;
    void *next;
    uint32_t subgroup_size, supported_stages, supported_operations, quad_operations_in_all_stages;
} ei_vk_subgroup_properties;

typedef struct { /* VkPhysicalDeviceMaintenance3Properties */
    int32_t s_type;
    void *next;
    uint32_t max_per_set_descriptors;
    uint64_t max_memory_allocation_size;
} ei_vk_maintenance3_properties;

typedef struct { /* VkPhysicalDeviceMemoryProperties */
    uint32_t type_count;
    struct { uint32_t property_flags, heap_index; } types[EI_VK_MAX_MEMORY_TYPES];
    uint32_t heap_count;
    struct { uint64_t size; uint32_t flags; } heaps[EI_VK_MAX_MEMORY_HEAPS];
} ei_vk_memory_properties;

typedef struct { /* VkPhysicalDeviceMemoryProperties2 */
    int32_t s_type;
    void *next;
    ei_vk_memory_properties memory;
} ei_vk_memory_properties2;

typedef struct { /* VkPhysicalDeviceMemoryBudgetPropertiesEXT */
    int32_t s_type;
    void *next;
    uint64_t heap_budget[EI_VK_MAX_MEMORY_HEAPS];
    uint64_t heap_usage[EI_VK_MAX_MEMORY_HEAPS];
} ei_vk_memory_budget;

/* VkPhysicalDeviceFeatures2: VkPhysicalDeviceFeatures is 55 VkBool32s */
typedef struct {
    int32_t s_type;
    void *next;
    uint32_t features[55];
} ei_vk_features2;

typedef struct { /* VkPhysicalDeviceShaderFloat16Int8Features */
    int32_t s_type;
    void *next;
    uint32_t shader_float16, shader_int8;
} ei_vk_float16_int8_features;

typedef struct { /* VkPhysicalDevice16BitStorageFeatures */
    int32_t s_type;
    void *next;
    uint32_t storage_buffer_16bit_access, uniform_and_storage_buffer_16bit_access, storage_push_constant16,
        storage_input_output16;
} ei_vk_16bit_storage_features;

typedef struct { /* VkPhysicalDeviceShaderIntegerDotProductFeatures */
    int32_t s_type;
    void *next;
    uint32_t shader_integer_dot_product;
} ei_vk_integer_dot_product_features;

typedef ei_vk_void_fn (EI_VKAPI *ei_vk_get_instance_proc_addr_fn)(ei_vk_instance, const char *);
typedef ei_vk_result (EI_VKAPI *ei_vk_enumerate_instance_version_fn)(uint32_t *);
typedef ei_vk_result (EI_VKAPI *ei_vk_enumerate_instance_extensions_fn)(const char *, uint32_t *, ei_vk_extension *);
typedef ei_vk_result (EI_VKAPI *ei_vk_create_instance_fn)(const ei_vk_instance_create_info *, const void *, ei_vk_instance *);
typedef void (EI_VKAPI *ei_vk_destroy_instance_fn)(ei_vk_instance, const void *);
typedef ei_vk_result (EI_VKAPI *ei_vk_enumerate_physical_devices_fn)(ei_vk_instance, uint32_t *, ei_vk_physical *);
typedef void (EI_VKAPI *ei_vk_get_properties2_fn)(ei_vk_physical, ei_vk_properties2 *);
typedef void (EI_VKAPI *ei_vk_get_features2_fn)(ei_vk_physical, ei_vk_features2 *);
typedef void (EI_VKAPI *ei_vk_get_memory_properties2_fn)(ei_vk_physical, ei_vk_memory_properties2 *);
typedef ei_vk_result (EI_VKAPI *ei_vk_enumerate_device_extensions_fn)(ei_vk_physical, const char *, uint32_t *, ei_vk_extension *);

#endif
