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
    EI_VK_ST_DEVICE_QUEUE_CREATE_INFO = 2,
    EI_VK_ST_DEVICE_CREATE_INFO = 3,
    EI_VK_ST_SUBMIT_INFO = 4,
    EI_VK_ST_MEMORY_ALLOCATE_INFO = 5,
    EI_VK_ST_FENCE_CREATE_INFO = 8,
    EI_VK_ST_BUFFER_CREATE_INFO = 12,
    EI_VK_ST_SHADER_MODULE_CREATE_INFO = 16,
    EI_VK_ST_PIPELINE_SHADER_STAGE_CREATE_INFO = 18,
    EI_VK_ST_COMPUTE_PIPELINE_CREATE_INFO = 29,
    EI_VK_ST_PIPELINE_LAYOUT_CREATE_INFO = 30,
    EI_VK_ST_DESCRIPTOR_SET_LAYOUT_CREATE_INFO = 32,
    EI_VK_ST_DESCRIPTOR_POOL_CREATE_INFO = 33,
    EI_VK_ST_DESCRIPTOR_SET_ALLOCATE_INFO = 34,
    EI_VK_ST_WRITE_DESCRIPTOR_SET = 35,
    EI_VK_ST_COMMAND_POOL_CREATE_INFO = 39,
    EI_VK_ST_COMMAND_BUFFER_ALLOCATE_INFO = 40,
    EI_VK_ST_COMMAND_BUFFER_BEGIN_INFO = 42,
    EI_VK_ST_MEMORY_BARRIER = 46,
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
 * first eight fields are uint32_t, maxStorageBufferRange the eighth, then the push constants'
 * size, two counts, two VkDeviceSize and the per-stage descriptor limits up to the storage
 * buffers'; then the rest */
#define EI_VK_PROPERTIES_ROOM 2048
typedef struct {
    uint32_t api_version, driver_version, vendor_id, device_id;
    int32_t device_type; /* 0 other, 1 integrated, 2 discrete, 3 virtual, 4 CPU */
    char device_name[256];
    uint8_t pipeline_cache_uuid[16];
    uint32_t pad; /* the limits start 8-aligned */
    uint32_t max_image_dimension[4], max_image_array_layers, max_texel_buffer_elements;
    uint32_t max_uniform_buffer_range, max_storage_buffer_range;
    uint32_t max_push_constants_size, max_memory_allocation_count, max_sampler_allocation_count, pad2;
    uint64_t buffer_image_granularity, sparse_address_space_size;
    uint32_t max_bound_descriptor_sets, max_per_stage_samplers, max_per_stage_uniform_buffers, max_per_stage_storage_buffers;
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


/* ---- compute: dispatchable handles are pointers, the others 64-bit integers on every ABI ---- */
typedef struct ei_vk_device_t *ei_vk_dev;
typedef struct ei_vk_queue_t *ei_vk_queue;
typedef struct ei_vk_command_buffer_t *ei_vk_cmd;
typedef uint64_t ei_vk_handle; /* VkBuffer, VkDeviceMemory, VkPipeline, VkFence, ... */

#define EI_VK_QUEUE_COMPUTE 0x2u
#define EI_VK_MEMORY_DEVICE_LOCAL 0x1u
#define EI_VK_MEMORY_HOST_VISIBLE 0x2u
#define EI_VK_MEMORY_HOST_COHERENT 0x4u
#define EI_VK_MEMORY_HOST_CACHED 0x8u
#define EI_VK_BUFFER_TRANSFER_SRC 0x1u
#define EI_VK_BUFFER_TRANSFER_DST 0x2u
#define EI_VK_BUFFER_STORAGE 0x20u
#define EI_VK_DESCRIPTOR_STORAGE_BUFFER 7
#define EI_VK_SHADER_STAGE_COMPUTE 0x20u
#define EI_VK_BIND_POINT_COMPUTE 1
#define EI_VK_ACCESS_SHADER_READ 0x20u
#define EI_VK_ACCESS_SHADER_WRITE 0x40u
#define EI_VK_ACCESS_TRANSFER_READ 0x800u
#define EI_VK_ACCESS_TRANSFER_WRITE 0x1000u
#define EI_VK_ACCESS_HOST_READ 0x2000u
#define EI_VK_STAGE_COMPUTE 0x800u
#define EI_VK_STAGE_TRANSFER 0x1000u
#define EI_VK_STAGE_HOST 0x4000u
#define EI_VK_COMMAND_POOL_RESET_BUFFER 0x2u
#define EI_VK_COMMAND_BUFFER_ONE_TIME 0x1u
#define EI_VK_ERROR_OUT_OF_HOST_MEMORY (-1)
#define EI_VK_ERROR_OUT_OF_DEVICE_MEMORY (-2)

typedef struct { /* VkQueueFamilyProperties */
    uint32_t flags, count, timestamp_valid_bits, granularity[3];
} ei_vk_queue_family;

typedef struct { /* VkDeviceQueueCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags, family, count;
    const float *priorities;
} ei_vk_queue_create_info;

typedef struct { /* VkDeviceCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags, queue_info_count;
    const ei_vk_queue_create_info *queue_infos;
    uint32_t layer_count;
    const char *const *layers;
    uint32_t extension_count;
    const char *const *extensions;
    const void *features; /* VkPhysicalDeviceFeatures */
} ei_vk_device_create_info;

typedef struct { /* VkBufferCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags;
    uint64_t size;
    uint32_t usage, sharing_mode, family_count;
    const uint32_t *families;
} ei_vk_buffer_create_info;

typedef struct { /* VkMemoryRequirements */
    uint64_t size, alignment;
    uint32_t type_bits;
} ei_vk_memory_requirements;

typedef struct { /* VkMemoryAllocateInfo */
    int32_t s_type;
    const void *next;
    uint64_t size;
    uint32_t type_index;
} ei_vk_memory_allocate_info;

typedef struct { /* VkShaderModuleCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags;
    size_t code_size;
    const uint32_t *code;
} ei_vk_shader_module_create_info;

typedef struct { /* VkDescriptorSetLayoutBinding */
    uint32_t binding, type, count, stages;
    const void *immutable_samplers;
} ei_vk_descriptor_binding;

typedef struct { /* VkDescriptorSetLayoutCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags, binding_count;
    const ei_vk_descriptor_binding *bindings;
} ei_vk_descriptor_layout_create_info;

typedef struct { /* VkPushConstantRange */
    uint32_t stages, offset, size;
} ei_vk_push_range;

typedef struct { /* VkPipelineLayoutCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags, set_layout_count;
    const ei_vk_handle *set_layouts;
    uint32_t push_range_count;
    const ei_vk_push_range *push_ranges;
} ei_vk_pipeline_layout_create_info;

typedef struct { /* VkSpecializationMapEntry */
    uint32_t id, offset;
    size_t size;
} ei_vk_specialization_entry;

typedef struct { /* VkSpecializationInfo */
    uint32_t entry_count;
    const ei_vk_specialization_entry *entries;
    size_t data_size;
    const void *data;
} ei_vk_specialization_info;

typedef struct { /* VkPipelineShaderStageCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags, stage;
    ei_vk_handle module;
    const char *entry;
    const ei_vk_specialization_info *specialization;
} ei_vk_shader_stage_create_info;

typedef struct { /* VkComputePipelineCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags;
    ei_vk_shader_stage_create_info stage;
    ei_vk_handle layout, base_pipeline;
    int32_t base_index;
} ei_vk_compute_pipeline_create_info;

typedef struct { /* VkDescriptorPoolSize */
    uint32_t type, count;
} ei_vk_descriptor_pool_size;

typedef struct { /* VkDescriptorPoolCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags, max_sets, size_count;
    const ei_vk_descriptor_pool_size *sizes;
} ei_vk_descriptor_pool_create_info;

typedef struct { /* VkDescriptorSetAllocateInfo */
    int32_t s_type;
    const void *next;
    ei_vk_handle pool;
    uint32_t count;
    const ei_vk_handle *layouts;
} ei_vk_descriptor_set_allocate_info;

typedef struct { /* VkDescriptorBufferInfo */
    ei_vk_handle buffer;
    uint64_t offset, range;
} ei_vk_descriptor_buffer_info;

typedef struct { /* VkWriteDescriptorSet */
    int32_t s_type;
    const void *next;
    ei_vk_handle set;
    uint32_t binding, array_element, count, type;
    const void *images;
    const ei_vk_descriptor_buffer_info *buffers;
    const void *texel_views;
} ei_vk_write_descriptor_set;

typedef struct { /* VkCommandPoolCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags, family;
} ei_vk_command_pool_create_info;

typedef struct { /* VkCommandBufferAllocateInfo */
    int32_t s_type;
    const void *next;
    ei_vk_handle pool;
    uint32_t level, count;
} ei_vk_command_buffer_allocate_info;

typedef struct { /* VkCommandBufferBeginInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags;
    const void *inheritance;
} ei_vk_command_buffer_begin_info;

typedef struct { /* VkMemoryBarrier */
    int32_t s_type;
    const void *next;
    uint32_t src_access, dst_access;
} ei_vk_memory_barrier;

typedef struct { /* VkBufferCopy */
    uint64_t src_offset, dst_offset, size;
} ei_vk_buffer_copy;

typedef struct { /* VkSubmitInfo */
    int32_t s_type;
    const void *next;
    uint32_t wait_count;
    const ei_vk_handle *wait_semaphores;
    const uint32_t *wait_stages;
    uint32_t command_buffer_count;
    const ei_vk_cmd *command_buffers;
    uint32_t signal_count;
    const ei_vk_handle *signal_semaphores;
} ei_vk_submit_info;

typedef struct { /* VkFenceCreateInfo */
    int32_t s_type;
    const void *next;
    uint32_t flags;
} ei_vk_fence_create_info;

/* the device-level entry points the compute context uses, looked up once per device */
#define EI_VK_DEVICE_FUNCTIONS(X) \
    X(GetDeviceQueue, void, (ei_vk_dev, uint32_t, uint32_t, ei_vk_queue *)) \
    X(DestroyDevice, void, (ei_vk_dev, const void *)) \
    X(DeviceWaitIdle, ei_vk_result, (ei_vk_dev)) \
    X(CreateBuffer, ei_vk_result, (ei_vk_dev, const ei_vk_buffer_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyBuffer, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(GetBufferMemoryRequirements, void, (ei_vk_dev, ei_vk_handle, ei_vk_memory_requirements *)) \
    X(AllocateMemory, ei_vk_result, (ei_vk_dev, const ei_vk_memory_allocate_info *, const void *, ei_vk_handle *)) \
    X(FreeMemory, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(BindBufferMemory, ei_vk_result, (ei_vk_dev, ei_vk_handle, ei_vk_handle, uint64_t)) \
    X(MapMemory, ei_vk_result, (ei_vk_dev, ei_vk_handle, uint64_t, uint64_t, uint32_t, void **)) \
    X(UnmapMemory, void, (ei_vk_dev, ei_vk_handle)) \
    X(CreateShaderModule, ei_vk_result, (ei_vk_dev, const ei_vk_shader_module_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyShaderModule, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(CreateDescriptorSetLayout, ei_vk_result, (ei_vk_dev, const ei_vk_descriptor_layout_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyDescriptorSetLayout, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(CreatePipelineLayout, ei_vk_result, (ei_vk_dev, const ei_vk_pipeline_layout_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyPipelineLayout, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(CreateComputePipelines, ei_vk_result, (ei_vk_dev, ei_vk_handle, uint32_t, const ei_vk_compute_pipeline_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyPipeline, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(CreateDescriptorPool, ei_vk_result, (ei_vk_dev, const ei_vk_descriptor_pool_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyDescriptorPool, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(ResetDescriptorPool, ei_vk_result, (ei_vk_dev, ei_vk_handle, uint32_t)) \
    X(AllocateDescriptorSets, ei_vk_result, (ei_vk_dev, const ei_vk_descriptor_set_allocate_info *, ei_vk_handle *)) \
    X(UpdateDescriptorSets, void, (ei_vk_dev, uint32_t, const ei_vk_write_descriptor_set *, uint32_t, const void *)) \
    X(CreateCommandPool, ei_vk_result, (ei_vk_dev, const ei_vk_command_pool_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyCommandPool, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(AllocateCommandBuffers, ei_vk_result, (ei_vk_dev, const ei_vk_command_buffer_allocate_info *, ei_vk_cmd *)) \
    X(BeginCommandBuffer, ei_vk_result, (ei_vk_cmd, const ei_vk_command_buffer_begin_info *)) \
    X(EndCommandBuffer, ei_vk_result, (ei_vk_cmd)) \
    X(ResetCommandBuffer, ei_vk_result, (ei_vk_cmd, uint32_t)) \
    X(CmdBindPipeline, void, (ei_vk_cmd, uint32_t, ei_vk_handle)) \
    X(CmdBindDescriptorSets, void, (ei_vk_cmd, uint32_t, ei_vk_handle, uint32_t, uint32_t, const ei_vk_handle *, uint32_t, const uint32_t *)) \
    X(CmdPushConstants, void, (ei_vk_cmd, ei_vk_handle, uint32_t, uint32_t, uint32_t, const void *)) \
    X(CmdDispatch, void, (ei_vk_cmd, uint32_t, uint32_t, uint32_t)) \
    X(CmdPipelineBarrier, void, (ei_vk_cmd, uint32_t, uint32_t, uint32_t, uint32_t, const ei_vk_memory_barrier *, uint32_t, const void *, uint32_t, const void *)) \
    X(CmdCopyBuffer, void, (ei_vk_cmd, ei_vk_handle, ei_vk_handle, uint32_t, const ei_vk_buffer_copy *)) \
    X(QueueSubmit, ei_vk_result, (ei_vk_queue, uint32_t, const ei_vk_submit_info *, ei_vk_handle)) \
    X(CreateFence, ei_vk_result, (ei_vk_dev, const ei_vk_fence_create_info *, const void *, ei_vk_handle *)) \
    X(DestroyFence, void, (ei_vk_dev, ei_vk_handle, const void *)) \
    X(WaitForFences, ei_vk_result, (ei_vk_dev, uint32_t, const ei_vk_handle *, uint32_t, uint64_t)) \
    X(ResetFences, ei_vk_result, (ei_vk_dev, uint32_t, const ei_vk_handle *))

typedef void (EI_VKAPI *ei_vk_get_queue_families_fn)(ei_vk_physical, uint32_t *, ei_vk_queue_family *);
typedef ei_vk_result (EI_VKAPI *ei_vk_create_device_fn)(ei_vk_physical, const ei_vk_device_create_info *, const void *, ei_vk_dev *);
typedef ei_vk_void_fn (EI_VKAPI *ei_vk_get_device_proc_addr_fn)(ei_vk_dev, const char *);

#endif
