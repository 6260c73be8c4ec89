// model.sequences: the mechanism driven by random, reproducible sequences of operations with
// several allocators, allocations and prefixes alive at once, every reply compared with the
// reference model and the operating system after every step (include/nxmem/conform/model/).
// RapidCheck generates the sequences (rc::state) from the suite's seed and shrinks a failing one;
// the finding names the seed, the step, the figure that contradicts the model and the shrunk
// sequence.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/model/driver.hpp>
#include <nxmem/conform/model/operation.hpp>
#include <nxmem/conform/subject.hpp>

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>

namespace nxmem::conform {

namespace model {

// RapidCheck's model of the generation: none is needed, since a step names its objects by pick.
struct generation_state {};

class step_command final : public rc::state::Command<generation_state, model_driver> {
public:
    explicit step_command(operation step) : step_(step) {}
    void run(const generation_state&, model_driver& driver) const override { driver.apply(step_); }
    void show(std::ostream& out) const override { out << step_; }

private:
    operation step_;
};

// Hears nothing: the suite reports the result itself.
class quiet_listener final : public rc::detail::TestListener {
public:
    void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
    void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
    void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

inline constexpr int longest_sequence = 200; // RapidCheck's maxSize: sequences grow to this length

// Runs sequences of up to longest_sequence operations until about `steps` have run; the finding on
// failure (blaming the rules its text names), or a warning naming each rule not in force for the
// plugin that it contradicted (`rules`).
inline finding check_sequences(const subject& target, std::uint64_t seed, unsigned steps,
                               const rule_set& rules = {}) {
    std::uint64_t steps_run = 0;
    std::map<std::string, std::string> warnings; // rule -> the first contradiction of it
    bool failed_once = false; // from then on RapidCheck is shrinking: every sequence must run
    const rc::detail::Property property = rc::detail::toProperty([&] {
        if (steps_run >= steps && !failed_once) {
            return; // the budget is spent: the remaining cases pass without running
        }
        try {
            model_driver driver(target, steps_run, rules, &warnings);
            rc::state::check(generation_state{}, driver, [](const generation_state&) {
                return rc::gen::map(generate_operation(), [](const operation& step) {
                    return std::shared_ptr<const rc::state::Command<generation_state, model_driver>>(
                        std::make_shared<step_command>(step));
                });
            });
            driver.finish();
        } catch (...) {
            failed_once = true;
            throw;
        }
    });
    rc::detail::TestParams params;
    params.seed = seed;
    params.maxSize = longest_sequence;
    params.maxSuccess = static_cast<int>(std::max(1u, steps)); // an upper bound: the budget stops first
    quiet_listener listener;
    const rc::detail::TestResult outcome = rc::detail::checkProperty(
        property, rc::detail::TestMetadata{"model.sequences", target.describe()}, params, listener, {});
    rc::detail::FailureResult failure;
    if (outcome.match(failure)) {
        std::ostringstream sequence;
        std::size_t shown = 0;
        for (const auto& [type, value] : failure.counterExample) {
            (void)type;
            for (char c : value) {
                sequence << (c == '\n' ? std::string("; ") : std::string(1, c));
            }
            ++shown;
        }
        std::string text = failure.description;
        if (const std::size_t cut = text.find("\n"); cut != std::string::npos && cut + 1 == text.size()) {
            text.erase(cut);
        }
        std::string blamed;
        for (const std::string& id : rule_set::rule_ids_in(text.substr(0, text.find(" {the steps before it")))) {
            blamed += (blamed.empty() ? "" : " ") + id;
        }
        return failed_rule(blamed, "every figure the plugin reports agrees with the reference model and the "
                      "operating system after every step",
                      text + " [seed " + std::to_string(seed) + ", sequence " +
                          std::to_string(failure.numSuccess + 1) + "; shrunk to: " + sequence.str() +
                          "; replay: --seed " + std::to_string(seed) + " --steps " +
                          std::to_string(steps) + "]");
    }
    rc::detail::GaveUpResult gave_up;
    if (outcome.match(gave_up)) {
        return failed("the model check runs its sequences", "gave up: " + gave_up.description);
    }
    rc::detail::Error error;
    if (outcome.match(error)) {
        return failed("the model check runs its sequences", "error: " + error.description);
    }
    if (!warnings.empty()) {
        finding warned{outcome::warn, "every figure the plugin reports agrees with the reference model", {}, {}};
        for (const auto& [rule, text] : warnings) {
            warned.rule += (warned.rule.empty() ? "" : " ") + rule;
            warned.actual += (warned.actual.empty() ? "" : " | ") + text + " [not failing: " +
                             rules.not_in_force(rule).value_or("a rule not in force") + "]";
        }
        return warned;
    }
    return passed();
}

} // namespace model

// model.sequences (the check's body; options.model_seed and options.model_steps bound it).
struct check_model_sequences {
    static finding run(const subject& target, const suite_options& options) {
        if (options.model_steps == 0) {
            return not_applicable("--steps 0: no sequence was asked for");
        }
        return model::check_sequences(target, options.model_seed, options.model_steps, options.rules);
    }
};

} // namespace nxmem::conform
