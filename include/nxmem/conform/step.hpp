// The step a check is at. A check announces each main step ("allocate 1 B at alignment 1"), and a
// caller that listens (the nxmem tool streams each step to its parent process) can then say where
// in the check a crash or a hang happened. Without a listener announcing costs a test of an empty
// std::function.
#pragma once

#include <functional>
#include <string_view>
#include <utility>

namespace nxmem::conform {

inline std::function<void(std::string_view)>& step_listener() {
    static std::function<void(std::string_view)> listener;
    return listener;
}

// Announces the step the calling check is about to take.
inline void announce_step(std::string_view step) {
    if (const auto& listener = step_listener()) {
        listener(step);
    }
}

// Installs a listener for its lifetime (the suite does, for one mechanism's run).
class listen_to_steps {
public:
    explicit listen_to_steps(std::function<void(std::string_view)> listener) {
        step_listener() = std::move(listener);
    }
    listen_to_steps(const listen_to_steps&) = delete;
    listen_to_steps& operator=(const listen_to_steps&) = delete;
    ~listen_to_steps() { step_listener() = nullptr; }
};

} // namespace nxmem::conform
