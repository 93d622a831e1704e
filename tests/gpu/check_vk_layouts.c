/* simd/gpu_vulkan/vk_min.h declares the Vulkan structures it uses from the specification's
 * layouts, so that the package builds without Vulkan headers. This file, compiled by
 * tests/gpu/test_vk_layouts.py where Khronos' vulkan_core.h is installed (libvulkan-dev),
 * holds every declared structure against the real one: sizes and the offset of each field. */
#include <stddef.h>
#include <vulkan/vulkan_core.h>

#include "../../simd/gpu_vulkan/vk_min.h"

#define SAME_SIZE(ours, theirs) _Static_assert(sizeof(ours) == sizeof(theirs), #ours " size")
#define SAME_AT(ours, f, theirs, g) _Static_assert(offsetof(ours, f) == offsetof(theirs, g), #ours "." #f)

SAME_SIZE(ei_vk_application_info, VkApplicationInfo);
SAME_AT(ei_vk_application_info, api_version, VkApplicationInfo, apiVersion);
SAME_SIZE(ei_vk_instance_create_info, VkInstanceCreateInfo);
SAME_AT(ei_vk_instance_create_info, extensions, VkInstanceCreateInfo, ppEnabledExtensionNames);
SAME_SIZE(ei_vk_extension, VkExtensionProperties);
SAME_AT(ei_vk_properties, device_type, VkPhysicalDeviceProperties, deviceType);
SAME_AT(ei_vk_properties, device_name, VkPhysicalDeviceProperties, deviceName);
SAME_AT(ei_vk_properties, max_storage_buffer_range, VkPhysicalDeviceProperties, limits.maxStorageBufferRange);
SAME_AT(ei_vk_properties, max_push_constants_size, VkPhysicalDeviceProperties, limits.maxPushConstantsSize);
SAME_AT(ei_vk_properties, max_per_stage_storage_buffers, VkPhysicalDeviceProperties, limits.maxPerStageDescriptorStorageBuffers);
_Static_assert(sizeof(ei_vk_properties) >= sizeof(VkPhysicalDeviceProperties), "properties room");
SAME_AT(ei_vk_properties2, properties, VkPhysicalDeviceProperties2, properties);
SAME_SIZE(ei_vk_driver_properties, VkPhysicalDeviceDriverProperties);
SAME_AT(ei_vk_driver_properties, driver_info, VkPhysicalDeviceDriverProperties, driverInfo);
SAME_SIZE(ei_vk_subgroup_properties, VkPhysicalDeviceSubgroupProperties);
SAME_AT(ei_vk_subgroup_properties, supported_operations, VkPhysicalDeviceSubgroupProperties, supportedOperations);
SAME_SIZE(ei_vk_maintenance3_properties, VkPhysicalDeviceMaintenance3Properties);
SAME_AT(ei_vk_maintenance3_properties, max_memory_allocation_size, VkPhysicalDeviceMaintenance3Properties, maxMemoryAllocationSize);
SAME_SIZE(ei_vk_memory_properties, VkPhysicalDeviceMemoryProperties);
SAME_AT(ei_vk_memory_properties, heap_count, VkPhysicalDeviceMemoryProperties, memoryHeapCount);
SAME_AT(ei_vk_memory_properties, heaps, VkPhysicalDeviceMemoryProperties, memoryHeaps);
SAME_SIZE(ei_vk_memory_properties2, VkPhysicalDeviceMemoryProperties2);
SAME_SIZE(ei_vk_memory_budget, VkPhysicalDeviceMemoryBudgetPropertiesEXT);
SAME_AT(ei_vk_memory_budget, heap_usage, VkPhysicalDeviceMemoryBudgetPropertiesEXT, heapUsage);
SAME_SIZE(ei_vk_features2, VkPhysicalDeviceFeatures2);
SAME_SIZE(ei_vk_float16_int8_features, VkPhysicalDeviceShaderFloat16Int8Features);
SAME_SIZE(ei_vk_16bit_storage_features, VkPhysicalDevice16BitStorageFeatures);
SAME_SIZE(ei_vk_integer_dot_product_features, VkPhysicalDeviceShaderIntegerDotProductFeatures);

SAME_SIZE(ei_vk_queue_family, VkQueueFamilyProperties);
SAME_SIZE(ei_vk_queue_create_info, VkDeviceQueueCreateInfo);
SAME_AT(ei_vk_queue_create_info, priorities, VkDeviceQueueCreateInfo, pQueuePriorities);
SAME_SIZE(ei_vk_device_create_info, VkDeviceCreateInfo);
SAME_AT(ei_vk_device_create_info, queue_infos, VkDeviceCreateInfo, pQueueCreateInfos);
SAME_AT(ei_vk_device_create_info, features, VkDeviceCreateInfo, pEnabledFeatures);
SAME_SIZE(ei_vk_buffer_create_info, VkBufferCreateInfo);
SAME_AT(ei_vk_buffer_create_info, size, VkBufferCreateInfo, size);
SAME_AT(ei_vk_buffer_create_info, usage, VkBufferCreateInfo, usage);
SAME_AT(ei_vk_buffer_create_info, families, VkBufferCreateInfo, pQueueFamilyIndices);
SAME_SIZE(ei_vk_memory_requirements, VkMemoryRequirements);
SAME_AT(ei_vk_memory_requirements, type_bits, VkMemoryRequirements, memoryTypeBits);
SAME_SIZE(ei_vk_memory_allocate_info, VkMemoryAllocateInfo);
SAME_AT(ei_vk_memory_allocate_info, type_index, VkMemoryAllocateInfo, memoryTypeIndex);
SAME_SIZE(ei_vk_shader_module_create_info, VkShaderModuleCreateInfo);
SAME_AT(ei_vk_shader_module_create_info, code, VkShaderModuleCreateInfo, pCode);
SAME_SIZE(ei_vk_descriptor_binding, VkDescriptorSetLayoutBinding);
SAME_AT(ei_vk_descriptor_binding, stages, VkDescriptorSetLayoutBinding, stageFlags);
SAME_SIZE(ei_vk_descriptor_layout_create_info, VkDescriptorSetLayoutCreateInfo);
SAME_AT(ei_vk_descriptor_layout_create_info, bindings, VkDescriptorSetLayoutCreateInfo, pBindings);
SAME_SIZE(ei_vk_push_range, VkPushConstantRange);
SAME_SIZE(ei_vk_pipeline_layout_create_info, VkPipelineLayoutCreateInfo);
SAME_AT(ei_vk_pipeline_layout_create_info, push_ranges, VkPipelineLayoutCreateInfo, pPushConstantRanges);
SAME_SIZE(ei_vk_specialization_entry, VkSpecializationMapEntry);
SAME_SIZE(ei_vk_specialization_info, VkSpecializationInfo);
SAME_SIZE(ei_vk_shader_stage_create_info, VkPipelineShaderStageCreateInfo);
SAME_AT(ei_vk_shader_stage_create_info, module, VkPipelineShaderStageCreateInfo, module);
SAME_AT(ei_vk_shader_stage_create_info, specialization, VkPipelineShaderStageCreateInfo, pSpecializationInfo);
SAME_SIZE(ei_vk_compute_pipeline_create_info, VkComputePipelineCreateInfo);
SAME_AT(ei_vk_compute_pipeline_create_info, stage, VkComputePipelineCreateInfo, stage);
SAME_AT(ei_vk_compute_pipeline_create_info, layout, VkComputePipelineCreateInfo, layout);
SAME_AT(ei_vk_compute_pipeline_create_info, base_index, VkComputePipelineCreateInfo, basePipelineIndex);
SAME_SIZE(ei_vk_descriptor_pool_size, VkDescriptorPoolSize);
SAME_SIZE(ei_vk_descriptor_pool_create_info, VkDescriptorPoolCreateInfo);
SAME_AT(ei_vk_descriptor_pool_create_info, sizes, VkDescriptorPoolCreateInfo, pPoolSizes);
SAME_SIZE(ei_vk_descriptor_set_allocate_info, VkDescriptorSetAllocateInfo);
SAME_AT(ei_vk_descriptor_set_allocate_info, layouts, VkDescriptorSetAllocateInfo, pSetLayouts);
SAME_SIZE(ei_vk_descriptor_buffer_info, VkDescriptorBufferInfo);
SAME_SIZE(ei_vk_write_descriptor_set, VkWriteDescriptorSet);
SAME_AT(ei_vk_write_descriptor_set, set, VkWriteDescriptorSet, dstSet);
SAME_AT(ei_vk_write_descriptor_set, type, VkWriteDescriptorSet, descriptorType);
SAME_AT(ei_vk_write_descriptor_set, buffers, VkWriteDescriptorSet, pBufferInfo);
SAME_SIZE(ei_vk_command_pool_create_info, VkCommandPoolCreateInfo);
SAME_SIZE(ei_vk_command_buffer_allocate_info, VkCommandBufferAllocateInfo);
SAME_AT(ei_vk_command_buffer_allocate_info, count, VkCommandBufferAllocateInfo, commandBufferCount);
SAME_SIZE(ei_vk_command_buffer_begin_info, VkCommandBufferBeginInfo);
SAME_SIZE(ei_vk_memory_barrier, VkMemoryBarrier);
SAME_SIZE(ei_vk_buffer_copy, VkBufferCopy);
SAME_SIZE(ei_vk_submit_info, VkSubmitInfo);
SAME_AT(ei_vk_submit_info, command_buffers, VkSubmitInfo, pCommandBuffers);
SAME_AT(ei_vk_submit_info, signal_semaphores, VkSubmitInfo, pSignalSemaphores);
SAME_SIZE(ei_vk_fence_create_info, VkFenceCreateInfo);

/* the constants, against the header's enums */
_Static_assert(EI_VK_ST_DEVICE_CREATE_INFO == VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_SUBMIT_INFO == VK_STRUCTURE_TYPE_SUBMIT_INFO, "sType");
_Static_assert(EI_VK_ST_MEMORY_ALLOCATE_INFO == VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, "sType");
_Static_assert(EI_VK_ST_FENCE_CREATE_INFO == VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_BUFFER_CREATE_INFO == VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_SHADER_MODULE_CREATE_INFO == VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_PIPELINE_SHADER_STAGE_CREATE_INFO == VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_COMPUTE_PIPELINE_CREATE_INFO == VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_PIPELINE_LAYOUT_CREATE_INFO == VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_DESCRIPTOR_SET_LAYOUT_CREATE_INFO == VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_DESCRIPTOR_POOL_CREATE_INFO == VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_DESCRIPTOR_SET_ALLOCATE_INFO == VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, "sType");
_Static_assert(EI_VK_ST_WRITE_DESCRIPTOR_SET == VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, "sType");
_Static_assert(EI_VK_ST_COMMAND_POOL_CREATE_INFO == VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, "sType");
_Static_assert(EI_VK_ST_COMMAND_BUFFER_ALLOCATE_INFO == VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, "sType");
_Static_assert(EI_VK_ST_COMMAND_BUFFER_BEGIN_INFO == VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, "sType");
_Static_assert(EI_VK_ST_MEMORY_BARRIER == VK_STRUCTURE_TYPE_MEMORY_BARRIER, "sType");
_Static_assert(EI_VK_ST_FEATURES_2 == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "sType");
_Static_assert(EI_VK_ST_DRIVER_PROPERTIES == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, "sType");
_Static_assert(EI_VK_ST_MEMORY_BUDGET_PROPERTIES == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT, "sType");
_Static_assert(EI_VK_ST_INTEGER_DOT_PRODUCT_FEATURES == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES, "sType");
_Static_assert(EI_VK_BUFFER_STORAGE == VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, "usage");
_Static_assert(EI_VK_DESCRIPTOR_STORAGE_BUFFER == VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, "descriptor");
_Static_assert(EI_VK_STAGE_COMPUTE == VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, "stage");
_Static_assert(EI_VK_STAGE_HOST == VK_PIPELINE_STAGE_HOST_BIT, "stage");
_Static_assert(EI_VK_ACCESS_HOST_READ == VK_ACCESS_HOST_READ_BIT, "access");
_Static_assert(EI_VK_ACCESS_TRANSFER_WRITE == VK_ACCESS_TRANSFER_WRITE_BIT, "access");
_Static_assert(EI_VK_MEMORY_HOST_CACHED == VK_MEMORY_PROPERTY_HOST_CACHED_BIT, "memory");
_Static_assert(EI_VK_COMMAND_POOL_RESET_BUFFER == VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, "pool");

int main(void) { return 0; }
