// A fake CUDA driver for the cuda plugin's tests, over host memory:
//   device memory (cuMemAlloc)   anonymous read/write mmap
//   address reservations         mmap(PROT_NONE), aligned
//   physical allocations         memfds (cuMemCreate), so a chunk mapped at two addresses is
//                                really the same memory
//   shareable handles            a duplicate of the memfd (export); import in any process takes
//                                only such a memfd (its name says so) and maps the same pages
//   cuMemMap / cuMemUnmap        mmap(MAP_SHARED|MAP_FIXED) of the memfd / PROT_NONE again
//   cuMemSetAccess               mprotect(PROT_READ|PROT_WRITE)
//   streams                      a host thread each, running the stream's queued work in order
//                                (copies, memsets, host functions, event records, waits on
//                                events), so
//                                work really runs later; the legacy default stream (0) orders
//                                against the blocking streams as the real one does, and the
//                                synchronous copies run on it. A test can hold a stream
//                                (fake_cuda_hold_stream) so that what it queues stays pending.
//   cuMemFree                    keeps the memory mapped and hands it out again (zeroed) to the
//                                next cuMemAlloc of the same size, as a driver's suballocator
//                                would: work still queued on freed memory lands in its next owner
// It exports only what a driver exports and the plugin looks up by name (cuDriverGetVersion,
// cuGetProcAddress_v2), plus the test controls of fake_cuda_control.h; every other entry point
// is reachable through cuGetProcAddress alone, which answers VERSION_NOT_SUFFICIENT to a request
// older than the signature it implements. It is as strict as the real driver where the plugin
// could go wrong: sizes must be granularity multiples, unmaps must cover whole mappings, a
// reservation must be empty to be freed, and memory calls need a current context.
#include "fake_cuda_control.h"

#include <cuda.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

struct CUctx_st {
    int device;
};

namespace {

// Where an event stands: each record is a generation; the event has completed when the stream
// work of its latest record has run. Shared with the queued work that fires it, so an event
// destroyed with a record pending stays valid for that work (as the real driver allows).
struct event_state {
    std::mutex mutex;
    std::condition_variable fired_changed;
    std::uint64_t recorded = 0; // generations recorded
    std::uint64_t fired = 0;    // the highest generation whose stream work has run

    std::uint64_t record() {
        std::lock_guard lock(mutex);
        return ++recorded;
    }
    void fire(std::uint64_t generation) {
        {
            std::lock_guard lock(mutex);
            fired = std::max(fired, generation);
        }
        fired_changed.notify_all();
    }
    std::uint64_t latest() {
        std::lock_guard lock(mutex);
        return recorded;
    }
    bool complete() {
        std::lock_guard lock(mutex);
        return fired >= recorded;
    }
    void wait_for(std::uint64_t generation) {
        std::unique_lock lock(mutex);
        fired_changed.wait(lock, [&] { return fired >= generation; });
    }
};

// One stream's queue and the thread that runs it, in order. While held, queued work stays
// pending (work already running finishes). Destroying it waits for every queued item to run.
class work_queue {
public:
    work_queue() : worker_([this] { run(); }) {}
    work_queue(const work_queue&) = delete;
    work_queue& operator=(const work_queue&) = delete;
    ~work_queue() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        changed_.notify_all();
        worker_.join();
    }

    // Queues `work`; returns its ticket (what wait_for takes).
    std::uint64_t enqueue(std::function<void()> work) {
        std::uint64_t ticket = 0;
        {
            std::lock_guard lock(mutex_);
            pending_.push_back(std::move(work));
            ticket = ++queued_;
        }
        changed_.notify_all();
        return ticket;
    }
    void hold(bool held) {
        {
            std::lock_guard lock(mutex_);
            held_ = held;
        }
        changed_.notify_all();
    }
    std::uint64_t unfinished() {
        std::lock_guard lock(mutex_);
        return queued_ - done_;
    }
    void wait_for(std::uint64_t ticket) {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return done_ >= ticket; });
    }
    void wait_idle() {
        std::unique_lock lock(mutex_);
        const std::uint64_t ticket = queued_;
        changed_.wait(lock, [&] { return done_ >= ticket; });
    }

private:
    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            changed_.wait(lock, [&] { return (!held_ && !pending_.empty()) || (stopping_ && pending_.empty()); });
            if (pending_.empty()) {
                return; // stopping, and nothing left to run
            }
            std::function<void()> work = std::move(pending_.front());
            pending_.pop_front();
            lock.unlock();
            work();
            lock.lock();
            ++done_;
            changed_.notify_all();
        }
    }

    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::function<void()>> pending_;
    std::uint64_t queued_ = 0;
    std::uint64_t done_ = 0;
    bool held_ = false;
    bool stopping_ = false;
    std::thread worker_; // last: starts once the rest is built
};

} // namespace

struct CUstream_st {
    explicit CUstream_st(unsigned created_with) : flags(created_with) {}
    const unsigned flags; // CU_STREAM_DEFAULT (blocking: orders against stream 0) or CU_STREAM_NON_BLOCKING
    work_queue queue;
};

struct CUevent_st {
    std::shared_ptr<event_state> state = std::make_shared<event_state>();
};

namespace {

struct physical {
    int fd;
    std::uint64_t size;
    int device;
    unsigned references; // 1 until cuMemRelease, plus one per mapping
    bool exportable;     // created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or imported
    bool imported;       // another process's memory: not this process's device_bytes
};

// The name of a physical allocation's memfd: what an import checks, and the device it is on.
constexpr char physical_name_prefix[] = "fake-cuda-physical-";

struct mapping {
    std::uint64_t size;
    physical* backing;
};

struct reservation {
    std::uint64_t size;
    std::map<std::uint64_t, mapping> mappings; // by address
};

struct fault {
    unsigned successes = 0;
    unsigned failures = 0;
    CUresult code = CUDA_SUCCESS;
};

constexpr int max_devices = 8;

struct fake_state {
    fake_cuda_config config{};
    bool initialised = false;
    CUctx_st contexts[max_devices]{};
    unsigned retains[max_devices]{};
    std::uint64_t used[max_devices]{};
    std::map<std::uint64_t, std::uint64_t> device_allocations; // address -> size
    std::map<std::uint64_t, reservation> reservations;         // base -> range
    std::map<std::uint64_t, physical*> handles;                // handle value -> allocation
    std::uint64_t mapping_count = 0;
    std::uint64_t physical_count = 0;
    std::uint64_t imported_count = 0;
    std::uint64_t calls_without_context = 0;
    std::uint64_t calls[FAKE_CUDA_CALL_KINDS]{};
    fault faults[FAKE_CUDA_CALL_KINDS]{};
    std::set<CUstream> streams;                                       // created, not destroyed
    std::set<CUevent> events;                                         // created, not destroyed
    std::map<std::uint64_t, std::vector<std::uint64_t>> freed_blocks; // size -> addresses, for reuse
    ~fake_state() {
        for (const auto& [size, addresses] : freed_blocks) {
            for (const std::uint64_t address : addresses) {
                ::munmap(reinterpret_cast<void*>(address), size);
            }
        }
    }
};

std::mutex state_mutex;
thread_local std::vector<CUcontext> context_stack;

std::uint64_t environment_number(const char* name, std::uint64_t fallback) {
    const char* text = std::getenv(name);
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 0) : fallback;
}

fake_cuda_config environment_config() {
    fake_cuda_config config{};
    config.devices = static_cast<int>(environment_number("NXMEM_FAKE_CUDA_DEVICES", 1));
    config.driver_version = static_cast<int>(environment_number("NXMEM_FAKE_CUDA_VERSION", 13000));
    config.granularity = environment_number("NXMEM_FAKE_CUDA_GRANULARITY", 2u << 20);
    config.device_memory = environment_number("NXMEM_FAKE_CUDA_MEMORY", 1u << 30);
    config.vmm_supported = static_cast<int>(environment_number("NXMEM_FAKE_CUDA_VMM", 1));
    config.posix_fd_supported = static_cast<int>(environment_number("NXMEM_FAKE_CUDA_POSIX_FD", 1));
    config.sharing_entry_points = static_cast<int>(environment_number("NXMEM_FAKE_CUDA_SHARING", 1));
    if (config.devices > max_devices) {
        config.devices = max_devices;
    }
    return config;
}

// Destroyed when the library is unloaded (the tests load and unload it many times).
fake_state& state() {
    static fake_state made = [] {
        fake_state fresh;
        fresh.config = environment_config();
        for (int i = 0; i < max_devices; ++i) {
            fresh.contexts[i].device = i;
        }
        return fresh;
    }();
    return made;
}

// CUDA_SUCCESS, or the injected failure due now. Counts successes.
CUresult injected(fake_state& fake, fake_cuda_call call) {
    fault& planned = fake.faults[call];
    if (planned.failures > 0) {
        if (planned.successes > 0) {
            --planned.successes;
        } else {
            --planned.failures;
            return planned.code;
        }
    }
    return CUDA_SUCCESS;
}

void succeeded(fake_state& fake, fake_cuda_call call) { ++fake.calls[call]; }

bool has_context() { return !context_stack.empty(); }

int current_device() { return has_context() ? context_stack.back()->device : 0; }

void note_context(fake_state& fake) {
    if (!has_context()) {
        ++fake.calls_without_context;
    }
}

bool valid_device(const fake_state& fake, int ordinal) {
    return fake.initialised && ordinal >= 0 && ordinal < fake.config.devices;
}

bool valid_properties(const fake_state& fake, const CUmemAllocationProp* properties) {
    return properties != nullptr && properties->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           properties->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           valid_device(fake, properties->location.id);
}

// The reservation containing [address, address + size), or nullptr.
reservation* reservation_of(fake_state& fake, std::uint64_t address, std::uint64_t size) {
    auto it = fake.reservations.upper_bound(address);
    if (it == fake.reservations.begin()) {
        return nullptr;
    }
    --it;
    if (address + size > it->first + it->second.size || address + size < address) {
        return nullptr;
    }
    return &it->second;
}

void drop_reference(fake_state& fake, physical* backing) {
    if (--backing->references == 0) {
        ::close(backing->fd);
        if (backing->imported) {
            --fake.imported_count;
        } else {
            fake.used[backing->device] -= backing->size;
        }
        fake.handles.erase(reinterpret_cast<std::uint64_t>(backing));
        delete backing;
        --fake.physical_count;
    }
}

void* map_aligned(std::uint64_t size, std::uint64_t alignment) {
    const std::uint64_t total = size + alignment;
    void* mapped = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) {
        return nullptr;
    }
    const auto start = reinterpret_cast<std::uint64_t>(mapped);
    const std::uint64_t aligned = (start + alignment - 1) & ~(alignment - 1);
    if (aligned > start) {
        ::munmap(mapped, aligned - start);
    }
    if (start + total > aligned + size) {
        ::munmap(reinterpret_cast<void*>(aligned + size), start + total - (aligned + size));
    }
    return reinterpret_cast<void*>(aligned);
}

// ---- the driver entry points ----

CUresult fake_get_error_name(CUresult code, const char** text) {
    switch (code) {
    case CUDA_SUCCESS: *text = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *text = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "CUDA_ERROR_NOT_INITIALIZED"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *text = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *text = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "CUDA_ERROR_NOT_SUPPORTED"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_PERMITTED: *text = "CUDA_ERROR_NOT_PERMITTED"; return CUDA_SUCCESS;
    case CUDA_ERROR_UNKNOWN: *text = "CUDA_ERROR_UNKNOWN"; return CUDA_SUCCESS;
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult fake_get_error_string(CUresult code, const char** text) {
    switch (code) {
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    default: return fake_get_error_name(code, text);
    }
}

CUresult fake_init(unsigned int flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (fake.config.devices <= 0) {
        return CUDA_ERROR_NO_DEVICE;
    }
    fake.initialised = true;
    return CUDA_SUCCESS;
}

CUresult fake_device_get_count(int* count) {
    std::lock_guard lock(state_mutex);
    if (!state().initialised) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    *count = state().config.devices;
    return CUDA_SUCCESS;
}

CUresult fake_device_get(CUdevice* device, int ordinal) {
    std::lock_guard lock(state_mutex);
    if (!valid_device(state(), ordinal)) {
        return state().initialised ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_NOT_INITIALIZED;
    }
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult fake_device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device) {
    std::lock_guard lock(state_mutex);
    if (!valid_device(state(), device)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = state().config.vmm_supported; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        *value = state().config.posix_fd_supported;
        break;
    default: *value = 0; break;
    }
    return CUDA_SUCCESS;
}

// "fake-cuda-gpu" and the ordinal: the same device has the same UUID in every process.
CUresult fake_device_get_uuid(CUuuid* uuid, CUdevice device) {
    std::lock_guard lock(state_mutex);
    if (uuid == nullptr || !valid_device(state(), device)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    std::memset(uuid->bytes, 0, sizeof uuid->bytes);
    std::memcpy(uuid->bytes, "fake-cuda-gpu", 13);
    uuid->bytes[15] = static_cast<char>(device);
    return CUDA_SUCCESS;
}

CUresult fake_primary_ctx_retain(CUcontext* context, CUdevice device) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!valid_device(fake, device)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_PRIMARY_CTX_RETAIN); code != CUDA_SUCCESS) {
        return code;
    }
    ++fake.retains[device];
    *context = &fake.contexts[device];
    succeeded(fake, FAKE_CUDA_PRIMARY_CTX_RETAIN);
    return CUDA_SUCCESS;
}

CUresult fake_primary_ctx_release(CUdevice device) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!valid_device(fake, device)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (fake.retains[device] == 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    --fake.retains[device];
    return CUDA_SUCCESS;
}

CUresult fake_ctx_push_current(CUcontext context) {
    if (context == nullptr) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    context_stack.push_back(context);
    return CUDA_SUCCESS;
}

CUresult fake_ctx_pop_current(CUcontext* context) {
    if (context_stack.empty()) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (context != nullptr) {
        *context = context_stack.back();
    }
    context_stack.pop_back();
    return CUDA_SUCCESS;
}

CUresult fake_mem_get_info(size_t* free_bytes, size_t* total_bytes) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!has_context()) {
        ++fake.calls_without_context;
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    const int device = current_device();
    *total_bytes = fake.config.device_memory;
    *free_bytes = fake.config.device_memory - fake.used[device];
    return CUDA_SUCCESS;
}

CUresult fake_mem_alloc(CUdeviceptr* address, size_t bytes) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!has_context()) {
        ++fake.calls_without_context;
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (bytes == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const int device = current_device();
    if (bytes > fake.config.device_memory - fake.used[device]) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_ALLOC); code != CUDA_SUCCESS) {
        return code;
    }
    void* mapped = nullptr;
    if (auto freed = fake.freed_blocks.find(bytes); freed != fake.freed_blocks.end()) {
        mapped = reinterpret_cast<void*>(freed->second.back()); // the latest freed first
        freed->second.pop_back();
        if (freed->second.empty()) {
            fake.freed_blocks.erase(freed);
        }
        std::memset(mapped, 0, bytes);
    } else {
        mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    fake.used[device] += bytes;
    *address = reinterpret_cast<CUdeviceptr>(mapped);
    fake.device_allocations.emplace(*address, bytes);
    succeeded(fake, FAKE_CUDA_MEM_ALLOC);
    return CUDA_SUCCESS;
}

CUresult fake_mem_free(CUdeviceptr address) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!has_context()) {
        ++fake.calls_without_context;
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    auto found = fake.device_allocations.find(address);
    if (found == fake.device_allocations.end()) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_FREE); code != CUDA_SUCCESS) {
        return code;
    }
    fake.freed_blocks[found->second].push_back(address); // stays mapped, for the next cuMemAlloc
    fake.used[current_device()] -= found->second;
    fake.device_allocations.erase(found);
    succeeded(fake, FAKE_CUDA_MEM_FREE);
    return CUDA_SUCCESS;
}

CUresult fake_mem_get_allocation_granularity(size_t* granularity, const CUmemAllocationProp* properties,
                                             CUmemAllocationGranularity_flags) {
    std::lock_guard lock(state_mutex);
    if (!valid_properties(state(), properties)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *granularity = state().config.granularity;
    return CUDA_SUCCESS;
}

CUresult fake_mem_address_reserve(CUdeviceptr* address, size_t size, size_t alignment,
                                  CUdeviceptr hint, unsigned long long flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    const std::uint64_t granularity = fake.config.granularity;
    if (size == 0 || size % granularity != 0 || hint != 0 || flags != 0 ||
        (alignment != 0 && (alignment & (alignment - 1)) != 0)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_ADDRESS_RESERVE); code != CUDA_SUCCESS) {
        return code;
    }
    void* mapped = map_aligned(size, alignment > granularity ? alignment : granularity);
    if (mapped == nullptr) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *address = reinterpret_cast<CUdeviceptr>(mapped);
    fake.reservations.emplace(*address, reservation{size, {}});
    succeeded(fake, FAKE_CUDA_MEM_ADDRESS_RESERVE);
    return CUDA_SUCCESS;
}

CUresult fake_mem_address_free(CUdeviceptr address, size_t size) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    auto found = fake.reservations.find(address);
    if (found == fake.reservations.end() || found->second.size != size || !found->second.mappings.empty()) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_ADDRESS_FREE); code != CUDA_SUCCESS) {
        return code;
    }
    ::munmap(reinterpret_cast<void*>(address), size);
    fake.reservations.erase(found);
    succeeded(fake, FAKE_CUDA_MEM_ADDRESS_FREE);
    return CUDA_SUCCESS;
}

CUresult fake_mem_create(CUmemGenericAllocationHandle* handle, size_t size,
                         const CUmemAllocationProp* properties, unsigned long long flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    if (!valid_properties(fake, properties) || size == 0 || size % fake.config.granularity != 0 ||
        flags != 0 || (properties->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
                       properties->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const bool exportable = properties->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (exportable && fake.config.posix_fd_supported == 0) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    const int device = properties->location.id;
    if (size > fake.config.device_memory - fake.used[device]) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_CREATE); code != CUDA_SUCCESS) {
        return code;
    }
    const std::string memfd_name = physical_name_prefix + std::to_string(device);
    const int fd = ::memfd_create(memfd_name.c_str(), MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        if (fd >= 0) {
            ::close(fd);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    auto* made = new physical{fd, size, device, 1, exportable, false};
    fake.used[device] += size;
    ++fake.physical_count;
    *handle = reinterpret_cast<std::uint64_t>(made);
    fake.handles.emplace(*handle, made);
    succeeded(fake, FAKE_CUDA_MEM_CREATE);
    return CUDA_SUCCESS;
}

CUresult fake_mem_release(CUmemGenericAllocationHandle handle) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    auto found = fake.handles.find(handle);
    if (found == fake.handles.end()) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_RELEASE); code != CUDA_SUCCESS) {
        return code;
    }
    // A released handle stays known while mapped; releasing it twice is caught by the count.
    physical* backing = found->second;
    fake.handles.erase(found);
    drop_reference(fake, backing);
    succeeded(fake, FAKE_CUDA_MEM_RELEASE);
    return CUDA_SUCCESS;
}

CUresult fake_mem_map(CUdeviceptr address, size_t size, size_t offset,
                      CUmemGenericAllocationHandle handle, unsigned long long flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    auto found = fake.handles.find(handle);
    reservation* range = reservation_of(fake, address, size);
    if (found == fake.handles.end() || range == nullptr || flags != 0 || size == 0 ||
        size % fake.config.granularity != 0 || offset % fake.config.granularity != 0 ||
        offset + size > found->second->size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // No overlap with an existing mapping.
    auto next = range->mappings.lower_bound(address);
    if ((next != range->mappings.end() && next->first < address + size) ||
        (next != range->mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > address)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_MAP); code != CUDA_SUCCESS) {
        return code;
    }
    physical* backing = found->second;
    if (::mmap(reinterpret_cast<void*>(address), size, PROT_NONE, MAP_SHARED | MAP_FIXED, backing->fd,
               static_cast<off_t>(offset)) == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ++backing->references;
    range->mappings.emplace(address, mapping{size, backing});
    ++fake.mapping_count;
    succeeded(fake, FAKE_CUDA_MEM_MAP);
    return CUDA_SUCCESS;
}

CUresult fake_mem_unmap(CUdeviceptr address, size_t size) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    reservation* range = reservation_of(fake, address, size);
    if (range == nullptr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // The range must consist of whole mappings, back to back.
    std::uint64_t cursor = address;
    for (auto it = range->mappings.find(address); cursor < address + size; ++it) {
        if (it == range->mappings.end() || it->first != cursor) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        cursor += it->second.size;
    }
    if (cursor != address + size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_UNMAP); code != CUDA_SUCCESS) {
        return code;
    }
    ::mmap(reinterpret_cast<void*>(address), size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    for (auto it = range->mappings.find(address); it != range->mappings.end() && it->first < address + size;) {
        drop_reference(fake, it->second.backing);
        it = range->mappings.erase(it);
        --fake.mapping_count;
    }
    succeeded(fake, FAKE_CUDA_MEM_UNMAP);
    return CUDA_SUCCESS;
}

CUresult fake_mem_set_access(CUdeviceptr address, size_t size, const CUmemAccessDesc* access, size_t count) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    reservation* range = reservation_of(fake, address, size);
    if (range == nullptr || access == nullptr || count != 1 ||
        access->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(fake, access->location.id) ||
        (access->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE && access->flags != CU_MEM_ACCESS_FLAGS_PROT_READ)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // Every byte of the range must be mapped.
    std::uint64_t cursor = address;
    auto it = range->mappings.upper_bound(address);
    if (it != range->mappings.begin()) {
        --it;
    }
    for (; it != range->mappings.end() && cursor < address + size; ++it) {
        if (it->first > cursor) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        cursor = std::max(cursor, it->first + it->second.size);
    }
    if (cursor < address + size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_SET_ACCESS); code != CUDA_SUCCESS) {
        return code;
    }
    ::mprotect(reinterpret_cast<void*>(address), size,
               access->flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ : PROT_READ | PROT_WRITE);
    succeeded(fake, FAKE_CUDA_MEM_SET_ACCESS);
    return CUDA_SUCCESS;
}

CUresult fake_mem_export_to_shareable_handle(void* shareable, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType type, unsigned long long flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    auto found = fake.handles.find(handle);
    if (shareable == nullptr || found == fake.handles.end() || flags != 0 ||
        type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!found->second->exportable) {
        return CUDA_ERROR_NOT_PERMITTED; // made without the handle type
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_EXPORT); code != CUDA_SUCCESS) {
        return code;
    }
    const int copy = ::fcntl(found->second->fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *static_cast<int*>(shareable) = copy;
    succeeded(fake, FAKE_CUDA_MEM_EXPORT);
    return CUDA_SUCCESS;
}

// The device of the fake's physical allocation behind `fd`, or -1 when it is none.
int device_of_physical_descriptor(int fd) {
    char link[128] = {};
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t length = ::readlink(path.c_str(), link, sizeof link - 1);
    const std::string target(link, length > 0 ? static_cast<std::size_t>(length) : 0);
    const std::string expected = std::string("/memfd:") + physical_name_prefix;
    if (target.rfind(expected, 0) != 0) {
        return -1;
    }
    return std::atoi(target.c_str() + expected.size());
}

CUresult fake_mem_import_from_shareable_handle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                               CUmemAllocationHandleType type) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    note_context(fake);
    const int fd = static_cast<int>(reinterpret_cast<std::uintptr_t>(os_handle));
    if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const int device = device_of_physical_descriptor(fd);
    struct stat facts {};
    if (!valid_device(fake, device) || ::fstat(fd, &facts) != 0 || facts.st_size <= 0 ||
        static_cast<std::uint64_t>(facts.st_size) % fake.config.granularity != 0) {
        return CUDA_ERROR_INVALID_VALUE; // not a physical allocation's descriptor
    }
    if (const CUresult code = injected(fake, FAKE_CUDA_MEM_IMPORT); code != CUDA_SUCCESS) {
        return code;
    }
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    auto* made = new physical{copy, static_cast<std::uint64_t>(facts.st_size), device, 1, true, true};
    ++fake.physical_count;
    ++fake.imported_count;
    *handle = reinterpret_cast<std::uint64_t>(made);
    fake.handles.emplace(*handle, made);
    succeeded(fake, FAKE_CUDA_MEM_IMPORT);
    return CUDA_SUCCESS;
}

// ---- streams, events, copies ----

// Stream 0 (and CU_STREAM_LEGACY): one for the process, its thread started on first use and
// joined when the library is unloaded.
CUstream_st& legacy_stream() {
    static CUstream_st made(CU_STREAM_DEFAULT);
    return made;
}

// The stream `handle` names, or nullptr. Under state_mutex.
CUstream_st* stream_of(const fake_state& fake, CUstream handle) {
    if (handle == nullptr || handle == CU_STREAM_LEGACY) {
        return &legacy_stream();
    }
    return fake.streams.count(handle) != 0 ? handle : nullptr;
}

// The event `handle` names, or nullptr. Under state_mutex.
event_state* event_of(const fake_state& fake, CUevent handle) {
    return fake.events.count(handle) != 0 ? handle->state.get() : nullptr;
}

// Queues `work` on `stream` after what the legacy default stream orders before it: on stream 0,
// the work queued so far on every blocking stream; on a blocking stream, that queued on stream 0.
// Under state_mutex (no queued work takes it).
std::uint64_t enqueue_ordered(const fake_state& fake, CUstream_st& stream, std::function<void()> work) {
    const auto after_tail_of = [&stream](CUstream_st& before) {
        if (before.queue.unfinished() == 0) {
            return;
        }
        auto marker = std::make_shared<event_state>();
        const std::uint64_t generation = marker->record();
        before.queue.enqueue([marker, generation] { marker->fire(generation); });
        stream.queue.enqueue([marker, generation] { marker->wait_for(generation); });
    };
    CUstream_st& legacy = legacy_stream();
    if (&stream == &legacy) {
        for (CUstream other : fake.streams) {
            if (other->flags == CU_STREAM_DEFAULT) {
                after_tail_of(*other);
            }
        }
    } else if (stream.flags == CU_STREAM_DEFAULT) {
        after_tail_of(legacy);
    }
    return stream.queue.enqueue(std::move(work));
}

CUresult fake_stream_create(CUstream* stream, unsigned int flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!has_context()) {
        ++fake.calls_without_context;
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (stream == nullptr || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    auto made = std::make_unique<CUstream_st>(flags);
    fake.streams.insert(made.get());
    *stream = made.release();
    return CUDA_SUCCESS;
}

// Waits for the stream's queued work to run (the real driver returns at once and frees it later).
CUresult fake_stream_destroy(CUstream stream) {
    {
        std::lock_guard lock(state_mutex);
        if (stream == nullptr || state().streams.erase(stream) == 0) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
    }
    delete stream;
    return CUDA_SUCCESS;
}

CUresult fake_stream_query(CUstream handle) {
    std::lock_guard lock(state_mutex);
    CUstream_st* stream = stream_of(state(), handle);
    if (stream == nullptr) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return stream->queue.unfinished() == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult fake_stream_synchronize(CUstream handle) {
    CUstream_st* stream = nullptr;
    {
        std::lock_guard lock(state_mutex);
        stream = stream_of(state(), handle);
    }
    if (stream == nullptr) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    stream->queue.wait_idle(); // outside the lock: the plugin's calls go on meanwhile
    return CUDA_SUCCESS;
}

// Waits for the work queued so far on every stream, stream 0 and the plugin's own included.
CUresult fake_ctx_synchronize() {
    std::vector<CUstream_st*> streams{&legacy_stream()};
    {
        std::lock_guard lock(state_mutex);
        fake_state& fake = state();
        if (!has_context()) {
            ++fake.calls_without_context;
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        streams.insert(streams.end(), fake.streams.begin(), fake.streams.end());
    }
    // Outside the lock: a stream's work may wait on another's, which must be able to run.
    for (CUstream_st* stream : streams) {
        stream->queue.wait_idle();
    }
    return CUDA_SUCCESS;
}

CUresult fake_stream_wait_event(CUstream handle, CUevent event, unsigned int flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    CUstream_st* stream = stream_of(fake, handle);
    event_state* waited = event_of(fake, event);
    if (stream == nullptr || waited == nullptr) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t generation = waited->latest(); // the latest record, as the real driver takes it
    if (generation != 0) {
        enqueue_ordered(fake, *stream, [shared = event->state, generation] { shared->wait_for(generation); });
    }
    return CUDA_SUCCESS;
}

CUresult fake_event_create(CUevent* event, unsigned int flags) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!has_context()) {
        ++fake.calls_without_context;
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    constexpr unsigned known_flags = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (event == nullptr || (flags & ~known_flags) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    auto made = std::make_unique<CUevent_st>();
    fake.events.insert(made.get());
    *event = made.release();
    return CUDA_SUCCESS;
}

CUresult fake_event_record(CUevent event, CUstream handle) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    CUstream_st* stream = stream_of(fake, handle);
    event_state* recorded = event_of(fake, event);
    if (stream == nullptr || recorded == nullptr) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    const std::uint64_t generation = recorded->record();
    enqueue_ordered(fake, *stream, [shared = event->state, generation] { shared->fire(generation); });
    return CUDA_SUCCESS;
}

CUresult fake_event_query(CUevent event) {
    std::lock_guard lock(state_mutex);
    event_state* queried = event_of(state(), event);
    if (queried == nullptr) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return queried->complete() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult fake_event_synchronize(CUevent event) {
    std::shared_ptr<event_state> waited;
    std::uint64_t generation = 0;
    {
        std::lock_guard lock(state_mutex);
        if (event_of(state(), event) == nullptr) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        waited = event->state;
        generation = waited->latest();
    }
    waited->wait_for(generation);
    return CUDA_SUCCESS;
}

CUresult fake_event_destroy(CUevent event) {
    {
        std::lock_guard lock(state_mutex);
        if (event == nullptr || state().events.erase(event) == 0) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
    }
    delete event; // a record still queued keeps its state alive
    return CUDA_SUCCESS;
}

CUresult fake_launch_host_func(CUstream handle, CUhostFn function, void* user_data) {
    std::lock_guard lock(state_mutex);
    CUstream_st* stream = stream_of(state(), handle);
    if (stream == nullptr) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (function == nullptr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    enqueue_ordered(state(), *stream, [function, user_data] { function(user_data); });
    return CUDA_SUCCESS;
}

// Queues `work` on the stream `handle` names, for a call that needs a current context; the stream
// and the work's ticket come back for a caller that waits.
CUresult enqueue_in_context(CUstream handle, std::function<void()> work, CUstream_st*& stream,
                            std::uint64_t& ticket) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    if (!has_context()) {
        ++fake.calls_without_context;
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    stream = stream_of(fake, handle);
    if (stream == nullptr) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    ticket = enqueue_ordered(fake, *stream, std::move(work));
    return CUDA_SUCCESS;
}

// Device memory is host memory here: a copy is a memcpy, run in order on its stream.
CUresult enqueue_copy(CUstream handle, void* destination, const void* source, size_t bytes, bool synchronous) {
    CUstream_st* stream = nullptr;
    std::uint64_t ticket = 0;
    const CUresult code = enqueue_in_context(
        handle, [destination, source, bytes] { std::memcpy(destination, source, bytes); }, stream, ticket);
    if (code == CUDA_SUCCESS && synchronous) {
        stream->queue.wait_for(ticket);
    }
    return code;
}

// A kernel-like write of device memory on a stream (the GPU test program's stand-in for a kernel).
CUresult fake_memset_d8_async(CUdeviceptr destination, unsigned char value, size_t bytes, CUstream handle) {
    CUstream_st* stream = nullptr;
    std::uint64_t ticket = 0;
    return enqueue_in_context(
        handle, [destination, value, bytes] { std::memset(reinterpret_cast<void*>(destination), value, bytes); },
        stream, ticket);
}

// The synchronous copies run on the legacy default stream and return once done, so they wait
// for the work queued before them there and on the blocking streams, as the real ones do.
CUresult fake_memcpy_htod(CUdeviceptr destination, const void* source, size_t bytes) {
    return enqueue_copy(nullptr, reinterpret_cast<void*>(destination), source, bytes, true);
}

CUresult fake_memcpy_dtoh(void* destination, CUdeviceptr source, size_t bytes) {
    return enqueue_copy(nullptr, destination, reinterpret_cast<const void*>(source), bytes, true);
}

CUresult fake_memcpy_htod_async(CUdeviceptr destination, const void* source, size_t bytes, CUstream stream) {
    return enqueue_copy(stream, reinterpret_cast<void*>(destination), source, bytes, false);
}

CUresult fake_memcpy_dtoh_async(void* destination, CUdeviceptr source, size_t bytes, CUstream stream) {
    return enqueue_copy(stream, destination, reinterpret_cast<const void*>(source), bytes, false);
}

// The entry points, each with the CUDA version whose signature it implements.
struct entry_point {
    const char* symbol;
    int version;
    void* function;
};

template <class F> void* as_pointer(F* function) { return reinterpret_cast<void*>(function); }

const entry_point entry_points[] = {
    {"cuGetErrorName", 6000, as_pointer(&fake_get_error_name)},
    {"cuGetErrorString", 6000, as_pointer(&fake_get_error_string)},
    {"cuInit", 2000, as_pointer(&fake_init)},
    {"cuDeviceGetCount", 2000, as_pointer(&fake_device_get_count)},
    {"cuDeviceGet", 2000, as_pointer(&fake_device_get)},
    {"cuDeviceGetAttribute", 2000, as_pointer(&fake_device_get_attribute)},
    {"cuDevicePrimaryCtxRetain", 7000, as_pointer(&fake_primary_ctx_retain)},
    {"cuDevicePrimaryCtxRelease", 11000, as_pointer(&fake_primary_ctx_release)},
    {"cuCtxPushCurrent", 4000, as_pointer(&fake_ctx_push_current)},
    {"cuCtxPopCurrent", 4000, as_pointer(&fake_ctx_pop_current)},
    {"cuMemGetInfo", 3020, as_pointer(&fake_mem_get_info)},
    {"cuMemAlloc", 3020, as_pointer(&fake_mem_alloc)},
    {"cuMemFree", 3020, as_pointer(&fake_mem_free)},
    {"cuMemGetAllocationGranularity", 10020, as_pointer(&fake_mem_get_allocation_granularity)},
    {"cuMemAddressReserve", 10020, as_pointer(&fake_mem_address_reserve)},
    {"cuMemAddressFree", 10020, as_pointer(&fake_mem_address_free)},
    {"cuMemCreate", 10020, as_pointer(&fake_mem_create)},
    {"cuMemRelease", 10020, as_pointer(&fake_mem_release)},
    {"cuMemMap", 10020, as_pointer(&fake_mem_map)},
    {"cuMemUnmap", 10020, as_pointer(&fake_mem_unmap)},
    {"cuMemSetAccess", 10020, as_pointer(&fake_mem_set_access)},
    {"cuDeviceGetUuid", 11040, as_pointer(&fake_device_get_uuid)},
    {"cuMemExportToShareableHandle", 10020, as_pointer(&fake_mem_export_to_shareable_handle)},
    {"cuMemImportFromShareableHandle", 10020, as_pointer(&fake_mem_import_from_shareable_handle)},
    {"cuMemcpyHtoD", 3020, as_pointer(&fake_memcpy_htod)},
    {"cuMemcpyDtoH", 3020, as_pointer(&fake_memcpy_dtoh)},
    {"cuMemcpyHtoDAsync", 3020, as_pointer(&fake_memcpy_htod_async)},
    {"cuMemcpyDtoHAsync", 3020, as_pointer(&fake_memcpy_dtoh_async)},
    {"cuCtxSynchronize", 2000, as_pointer(&fake_ctx_synchronize)},
    {"cuStreamCreate", 2000, as_pointer(&fake_stream_create)},
    {"cuStreamDestroy", 4000, as_pointer(&fake_stream_destroy)},
    {"cuStreamQuery", 2000, as_pointer(&fake_stream_query)},
    {"cuStreamSynchronize", 2000, as_pointer(&fake_stream_synchronize)},
    {"cuStreamWaitEvent", 3020, as_pointer(&fake_stream_wait_event)},
    {"cuEventCreate", 2000, as_pointer(&fake_event_create)},
    {"cuEventRecord", 2000, as_pointer(&fake_event_record)},
    {"cuEventQuery", 2000, as_pointer(&fake_event_query)},
    {"cuEventSynchronize", 2000, as_pointer(&fake_event_synchronize)},
    {"cuEventDestroy", 4000, as_pointer(&fake_event_destroy)},
    {"cuLaunchHostFunc", 10000, as_pointer(&fake_launch_host_func)},
    {"cuMemsetD8Async", 3020, as_pointer(&fake_memset_d8_async)},
};

} // namespace

// ---- exported as a driver exports them ----

FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
    if (version == nullptr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    std::lock_guard lock(state_mutex);
    *version = state().config.driver_version;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** function, int cuda_version,
                                         cuuint64_t, CUdriverProcAddressQueryResult* status) {
    if (symbol == nullptr || function == nullptr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *function = nullptr;
    bool sharing = false;
    {
        std::lock_guard lock(state_mutex);
        sharing = state().config.sharing_entry_points != 0;
    }
    for (const entry_point& entry : entry_points) {
        if (!sharing && std::strstr(entry.symbol, "ShareableHandle") != nullptr) {
            continue; // an older or cut-down driver
        }
        if (std::strcmp(entry.symbol, symbol) == 0) {
            if (cuda_version < entry.version) {
                if (status != nullptr) {
                    *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
                }
                return CUDA_ERROR_NOT_FOUND;
            }
            *function = entry.function;
            if (status != nullptr) {
                *status = CU_GET_PROC_ADDRESS_SUCCESS;
            }
            return CUDA_SUCCESS;
        }
    }
    if (status != nullptr) {
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return CUDA_ERROR_NOT_FOUND;
}

// ---- test controls ----

FAKE_EXPORT void fake_cuda_configure(const fake_cuda_config* config) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    fake.config = config != nullptr ? *config : environment_config();
    fake.initialised = false;
    fake.calls_without_context = 0;
    for (int call = 0; call < FAKE_CUDA_CALL_KINDS; ++call) {
        fake.calls[call] = 0;
        fake.faults[call] = fault{};
    }
}

FAKE_EXPORT void fake_cuda_fail(fake_cuda_call call, unsigned successes, unsigned failures, int code) {
    std::lock_guard lock(state_mutex);
    if (call >= 0 && call < FAKE_CUDA_CALL_KINDS) {
        state().faults[call] = fault{successes, failures, static_cast<CUresult>(code)};
    }
}

FAKE_EXPORT void fake_cuda_get_counts(fake_cuda_counts* counts) {
    std::lock_guard lock(state_mutex);
    fake_state& fake = state();
    fake_cuda_counts now{};
    now.device_allocations = fake.device_allocations.size();
    now.reservations = fake.reservations.size();
    now.handles = fake.physical_count;
    now.imported_handles = fake.imported_count;
    now.mappings = fake.mapping_count;
    now.device_bytes = fake.used[0];
    for (int device = 0; device < max_devices; ++device) {
        now.primary_retains += fake.retains[device];
    }
    now.calls_without_context = fake.calls_without_context;
    now.streams = fake.streams.size();
    now.events = fake.events.size();
    now.stream_work_pending = legacy_stream().queue.unfinished();
    for (CUstream stream : fake.streams) {
        now.stream_work_pending += stream->queue.unfinished();
    }
    for (int call = 0; call < FAKE_CUDA_CALL_KINDS; ++call) {
        now.calls[call] = fake.calls[call];
    }
    *counts = now;
}

FAKE_EXPORT unsigned fake_cuda_context_depth(void) {
    return static_cast<unsigned>(context_stack.size());
}

FAKE_EXPORT int fake_cuda_hold_stream(CUstream handle, int hold) {
    std::lock_guard lock(state_mutex);
    CUstream_st* stream = stream_of(state(), handle);
    if (stream == nullptr) {
        return -1;
    }
    stream->queue.hold(hold != 0);
    return 0;
}
