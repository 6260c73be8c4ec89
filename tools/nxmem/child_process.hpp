// Running plugin code in a forked child, so that nothing a plugin does (a crash, a hang, a write
// past a buffer) takes the nxmem command down with it. The child streams events, one JSON object
// a line, down a pipe; a SIGSEGV/SIGBUS handler in the child sends the faulting address as one
// more event before the child dies (nxmem/conform/detail/fault_report.hpp). `nxmem conform` and
// `nxmem inspect` both run plugins this way.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace nxmem::tool {

using emit_function = std::function<void(const nlohmann::json&)>;

struct child_outcome {
    std::vector<nlohmann::json> events; // every event but "step" and "fault"
    int wait_status = 0;
    bool timed_out = false;
    std::string fault;     // "SIGSEGV: a write at offset 8 of a status of size 8 (past its end)"
    std::string last_step; // the last step announced before the end ("" if none)

    // The child ran its body to the end and exited normally.
    bool finished() const;
    // How it ended when it did not finish: the fault, "timed out after 30 s", "SIGABRT",
    // "exit status 1" or "ended without finishing".
    std::string ending(unsigned timeout_seconds) const;
};

// Runs `body` in a forked child under an alarm of `timeout_seconds`. The body emits events; an
// event {"event":"step","text":...} records the step the child is at. The child never returns:
// it leaves with _exit, so nothing of the parent's is destroyed or flushed twice.
child_outcome run_in_child(const std::function<void(const emit_function&)>& body,
                           unsigned timeout_seconds);

} // namespace nxmem::tool
