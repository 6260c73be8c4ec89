// The C header is the contract, and these tests hold it to its word:
//  - its machine-readable @layout/@field annotations agree with the compiler and with the C++ table
//    in nxmem/abi/layout.hpp (the one table everything else derives from);
//  - a C compiler agrees with the annotations too, through generated _Static_asserts;
//  - the header compiles alone as C11, and so does the C example plugin against it alone;
//  - the layout of minors 0 to 4 is frozen: it matches test/abi/golden_layout.txt line for line,
//    each field's declared type and each slot's signature included.
//
// Environment (set by test/meson.build): NXMEM_C_COMPILER, NXMEM_INCLUDE_DIR, NXMEM_GOLDEN_LAYOUT,
// NXMEM_C_EXAMPLE, NXMEM_SCRATCH_DIR. A missing variable, or a C compiler that cannot be run, is a
// failure, never a skip: a contract check that silently did not run is worse than none.
//
// When appending a new minor, raise frozen_through_minor and run scripts/abi-baseline: it writes
// the golden dump of the current header through the hidden test
//   NXMEM_INCLUDE_DIR=include NXMEM_GOLDEN_OUT=FILE header_contract_tests "[golden-dump]"
// and refuses a dump that drops or changes a committed line.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 with -fsanitize=address reports a false maybe-uninitialized inside <regex> (GCC bug
// 105562); see test/support/catch_main.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <nxmem/abi/layout.hpp>

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

// The newest minor the golden file freezes. Raise it only together with appending that minor's
// lines to golden_layout.txt (scripts/abi-baseline does the appending).
constexpr std::uint32_t frozen_through_minor = 4;

const char* const abi_is_frozen =
    "The nxmem C ABI (major 1, minors 0 to 4) is FROZEN: plugins already compiled against it "
    "depend on every struct size, offset, field size and type, minor, slot name and slot "
    "signature in "
    "test/abi/golden_layout.txt. Do not move, resize, rename or remove anything; add new fields "
    "only by appending them at the end of a struct under a new minor. Never edit the golden file "
    "except to append a new minor.";

// ---- small utilities ----------------------------------------------------------------------------

// The value of an environment variable the test needs; a missing one fails the test, loudly.
std::string require_env(const char* name) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') {
        FAIL("environment variable " << name
                                     << " is not set: run this test through `meson test` (see "
                                        "test/meson.build), which sets it");
    }
    return value;
}

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        FAIL("cannot read " << path);
    }
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

void write_text_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
        FAIL("cannot write " << path);
    }
}

std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') {
            line.pop_back();
        }
        lines.push_back(line);
    }
    return lines;
}

// A path as one shell word: single-quoted, with embedded single quotes escaped.
std::string shell_quote(const std::string& word) {
    std::string quoted = "'";
    for (char c : word) {
        if (c == '\'') {
            quoted += "'\\''";
        } else {
            quoted += c;
        }
    }
    return quoted + "'";
}

struct command_result {
    int exit_status;     // the command's exit status; 127 when the shell could not run it
    std::string output;  // stdout and stderr together
    std::string command; // what was run, for the failure message
};

// Runs `command` through the shell, capturing its output in a file under the scratch directory.
command_result run_command(const std::string& command, const std::string& log_path) {
    const std::string full = command + " > " + shell_quote(log_path) + " 2>&1";
    const int raw = std::system(full.c_str());
    command_result result{-1, {}, command};
    if (raw != -1 && WIFEXITED(raw)) {
        result.exit_status = WEXITSTATUS(raw);
    }
    std::ifstream log(log_path, std::ios::binary);
    std::ostringstream text;
    text << log.rdbuf();
    result.output = text.str();
    return result;
}

// Compiles `source` to an object file with the C compiler under test, in strict C11.
command_result compile_c(const std::string& source, const std::string& stem) {
    const std::string compiler = require_env("NXMEM_C_COMPILER"); // may be several words
    const std::string include_dir = require_env("NXMEM_INCLUDE_DIR");
    const std::string scratch = require_env("NXMEM_SCRATCH_DIR");
    const std::string object = scratch + "/" + stem + ".o";
    const std::string command = compiler + " -std=c11 -Wall -Wextra -Werror -pedantic -I " +
                                shell_quote(include_dir) + " -c " + shell_quote(source) + " -o " +
                                shell_quote(object);
    return run_command(command, scratch + "/" + stem + ".log");
}

// A compile that must succeed: a compiler that cannot be run at all is a failure, not a skip.
void require_compiles(const command_result& compiled) {
    INFO("command: " << compiled.command);
    INFO("compiler output:\n" << compiled.output);
    if (compiled.exit_status == 127 || compiled.exit_status == 126 || compiled.exit_status < 0) {
        FAIL("the C compiler could not be run (exit status "
             << compiled.exit_status << "); NXMEM_C_COMPILER must name a working C compiler");
    }
    REQUIRE(compiled.exit_status == 0);
}

// ---- the layout as the header's annotations state it -------------------------------------------

struct annotated_field {
    std::string name;
    std::size_t offset = 0;
    std::size_t size = 0;
    std::uint32_t since = 0;
    std::size_t line = 0;
    std::string declared_type; // the declaration's type as the header spells it, normalised
};

struct annotated_struct {
    std::string name;
    std::size_t size = 0;
    std::size_t align = 0;
    std::uint32_t since = 0;
    std::size_t line = 0;
    std::vector<annotated_field> fields;
};

struct parsed_header {
    std::vector<annotated_struct> structs;
    std::vector<std::string> problems; // annotations that contradict the text they annotate
    // Every function pointer typedef of the header: its name and its signature without parameter
    // names, e.g. NxmemRetainFn -> "void (NxmemAllocatorVtable *)".
    std::map<std::string, std::string> function_types;
};

std::size_t to_size(const std::string& digits) {
    return static_cast<std::size_t>(std::stoull(digits));
}
std::uint32_t to_u32(const std::string& digits) {
    return static_cast<std::uint32_t>(std::stoul(digits));
}

// The type text with single spaces between words and pointers spelt `T *` / `T **`, so that the
// golden text does not depend on how the header is formatted.
std::string normalise_type(const std::string& text) {
    std::string spaced;
    for (char c : text) {
        spaced += c == '*' ? std::string(" * ") : std::string(1, c);
    }
    std::string out;
    std::istringstream words(spaced);
    for (std::string word; words >> word;) {
        const bool star_after_star = word == "*" && !out.empty() && out.back() == '*';
        if (!out.empty() && !star_after_star) {
            out += ' ';
        }
        out += word;
    }
    return out;
}

// A parameter declaration without its name: "const NxmemRangeRequest *request" ->
// "const NxmemRangeRequest *". Parameter names are not part of the ABI.
std::string parameter_type(const std::string& parameter) {
    // The last word is a name unless it is all there is, follows only a qualifier or `struct`, or
    // is itself a C type keyword (an unnamed `unsigned int`).
    static const std::regex named(R"(^(.*[\s*])(\w+)$)");
    static const std::set<std::string> not_a_name = {"void", "char", "short", "int", "long",
                                                     "float", "double", "signed", "unsigned"};
    std::smatch match;
    const std::string trimmed = normalise_type(parameter);
    if (std::regex_match(trimmed, match, named) && not_a_name.count(match[2].str()) == 0) {
        const std::string type = normalise_type(match[1].str());
        if (type != "const" && type != "struct" && type != "volatile") {
            return type;
        }
    }
    return trimmed;
}

// Every `typedef RET (*NAME)(PARAMS);` of the header text, comments removed first.
std::map<std::string, std::string> parse_function_types(const std::string& text) {
    static const std::regex comment(R"(/\*[\s\S]*?\*/)");
    static const std::regex function_typedef(
        R"(typedef\s+([^;(]*?)\(\s*\*\s*(\w+)\s*\)\s*\(([^;]*?)\)\s*;)");
    const std::string code = std::regex_replace(text, comment, " ");
    std::map<std::string, std::string> types;
    for (auto it = std::sregex_iterator(code.begin(), code.end(), function_typedef);
         it != std::sregex_iterator(); ++it) {
        std::string signature = normalise_type((*it)[1].str()) + " (";
        std::istringstream parameters((*it)[3].str());
        bool first = true;
        for (std::string parameter; std::getline(parameters, parameter, ',');) {
            signature += (first ? "" : ", ") + parameter_type(parameter);
            first = false;
        }
        types[(*it)[2].str()] = signature + ")";
    }
    return types;
}

// Reads the annotations and checks that they annotate what they claim: each @layout is followed
// by the definition of the struct it names, each @field sits on the declaration of the field it
// names inside that struct, and every declaration inside an annotated struct carries a @field.
parsed_header parse_header(const std::string& text) {
    static const std::regex layout_re(
        R"(@layout\s+(\w+)\s+size=(\d+)\s+align=(\d+)\s+since=(\d+)\s*\*/)");
    static const std::regex field_re(
        R"(@field\s+(\w+)\s+offset=(\d+)\s+size=(\d+)\s+since=(\d+)\s*\*/)");
    static const std::regex any_annotation_re(R"(@(layout|field)\b)");
    static const std::regex attempted_annotation_re(R"(@(layout|field)\s+\w+\s+(size|offset)=\d)");

    parsed_header parsed;
    const std::vector<std::string> lines = split_lines(text);
    enum class state { outside, expect_struct, in_body } where = state::outside;
    auto where_at = [](std::size_t index) {
        return "nxmem_memory_abi.h:" + std::to_string(index + 1);
    };

    for (std::size_t i = 0; i < lines.size(); ++i) {
        const std::string& line = lines[i];
        std::smatch match;
        if (std::regex_search(line, match, layout_re)) {
            if (where != state::outside) {
                parsed.problems.push_back(where_at(i) + ": @layout " + match[1].str() +
                                          " begins inside the previous annotated struct");
            }
            parsed.structs.push_back({match[1].str(),
                                      to_size(match[2].str()),
                                      to_size(match[3].str()),
                                      to_u32(match[4].str()),
                                      i + 1,
                                      {}});
            where = state::expect_struct;
            continue;
        }
        if (where == state::expect_struct) {
            if (line.find_first_not_of(" \t") == std::string::npos) {
                continue;
            }
            const std::string& name = parsed.structs.back().name;
            const std::regex opening(R"(^\s*(typedef\s+)?struct\s+)" + name + R"(\s*\{)");
            if (!std::regex_search(line, opening)) {
                parsed.problems.push_back(where_at(i) + ": @layout " + name +
                                          " is not followed by `struct " + name + " {`");
                where = state::outside;
                continue;
            }
            where = state::in_body;
            continue;
        }
        if (where == state::in_body) {
            const std::size_t comment = line.find("/*");
            const std::string code = line.substr(0, comment);
            const bool has_code = code.find_first_not_of(" \t") != std::string::npos;
            if (has_code && code.find('}') != std::string::npos) {
                where = state::outside;
                continue;
            }
            if (std::regex_search(line, match, field_re)) {
                const std::string name = match[1].str();
                // The declarator must be the field's own name: `type name;` or `type name[N];`
                // (also `type *name;`), with nothing after it but the annotation.
                const std::regex declares(R"((^|[^\w]))" + name + R"(\s*(\[[^\]]*\])?\s*;\s*$)");
                const std::regex type_of(R"(^\s*(.*?)\b)" + name +
                                         R"(\s*(\[[^\]]*\])?\s*;\s*$)");
                std::smatch declared;
                std::string declared_type;
                if (std::regex_match(code, declared, type_of)) {
                    declared_type = normalise_type(declared[1].str() + declared[2].str());
                }
                if (!std::regex_search(code, declares)) {
                    parsed.problems.push_back(
                        where_at(i) + ": @field " + name +
                        " annotates a declaration that does not declare it: `" + code + "`");
                }
                parsed.structs.back().fields.push_back({name, to_size(match[2].str()),
                                                        to_size(match[3].str()),
                                                        to_u32(match[4].str()), i + 1,
                                                        declared_type});
            } else if (has_code) {
                parsed.problems.push_back(
                    where_at(i) + ": a declaration in " + parsed.structs.back().name +
                    " carries no (well-formed) @field annotation: `" + line + "`");
            } else if (std::regex_search(line, any_annotation_re)) {
                parsed.problems.push_back(where_at(i) + ": malformed annotation: `" + line + "`");
            }
            continue;
        }
        if (std::regex_search(line, attempted_annotation_re)) {
            // An annotation outside an annotated struct, or a malformed @layout, is a mistake.
            // (The header's prose that explains the syntax uses letters, not numbers, and does
            // not match.)
            parsed.problems.push_back(where_at(i) +
                                      ": annotation outside an annotated struct, or "
                                      "malformed: `" +
                                      line + "`");
        }
    }
    if (where != state::outside) {
        parsed.problems.push_back("the last annotated struct is never closed");
    }
    parsed.function_types = parse_function_types(text);
    return parsed;
}

std::string read_header_file() {
    return read_text_file(require_env("NXMEM_INCLUDE_DIR") + "/nxmem/nxmem_memory_abi.h");
}

parsed_header parse_header_file() {
    return parse_header(read_header_file());
}

// ---- the layout as the compiler and the C++ table state it --------------------------------------

struct table_field {
    std::string name;
    std::size_t offset = 0;
    std::size_t size = 0;
    std::uint32_t since = 0;
    std::string role;
    std::string type; // ` type="..."`, plus ` signature="..."` for a slot; from the header's text
};

struct table_struct {
    std::string name;
    std::size_t size = 0;    // sizeof, from the compiler
    std::size_t align = 0;   // alignof, from the compiler
    std::uint32_t since = 0; // the minor that added the struct: that of its first field
    std::vector<table_field> fields;
};

std::string role_name(nxmem::abi::field_role role) {
    using nxmem::abi::field_role;
    switch (role) {
    case field_role::header:
        return "header";
    case field_role::data:
        return "data";
    case field_role::required_slot:
        return "required_slot";
    case field_role::optional_slot:
        return "optional_slot";
    case field_role::capability_table:
        return "capability_table";
    }
    return "unknown";
}

template <class T> table_struct describe_struct() {
    using traits = nxmem::abi::struct_traits<T>;
    table_struct described{std::string(traits::name), sizeof(T), alignof(T), 0, {}};
    bool first = true;
    for (const nxmem::abi::field_info& field : traits::fields) {
        described.since = first ? field.since : std::min(described.since, field.since);
        first = false;
        described.fields.push_back({std::string(field.name), field.offset, field.size, field.since,
                                    role_name(field.role), {}});
    }
    return described;
}

// Every struct of nxmem::abi::all_structs, in table order.
std::vector<table_struct> describe_all_structs() {
    std::vector<table_struct> all;
    []<class... T>(std::vector<table_struct>& out, std::type_identity<std::tuple<T...>>) {
        (out.push_back(describe_struct<T>()), ...);
    }(all, std::type_identity<nxmem::abi::all_structs>{});
    return all;
}

// The C++ table, each field with the type the header declares it with and, for a slot, the full
// signature of its function type: a slot whose signature changes keeps its offset and size, and
// only this text catches it without abidiff.
std::vector<table_struct> describe_contract(const std::string& header_text) {
    std::vector<table_struct> table = describe_all_structs();
    const parsed_header header = parse_header(header_text);
    for (table_struct& s : table) {
        const auto annotated =
            std::find_if(header.structs.begin(), header.structs.end(),
                         [&](const annotated_struct& a) { return a.name == s.name; });
        for (table_field& f : s.fields) {
            std::string declared = "(not annotated in the header)";
            if (annotated != header.structs.end()) {
                for (const annotated_field& a : annotated->fields) {
                    if (a.name == f.name && !a.declared_type.empty()) {
                        declared = a.declared_type;
                    }
                }
            }
            f.type = " type=\"" + declared + "\"";
            const auto function_type = header.function_types.find(declared);
            if (function_type != header.function_types.end()) {
                f.type += " signature=\"" + function_type->second + "\"";
            }
        }
    }
    return table;
}

// ---- the golden dump ---------------------------------------------------------------------------

std::string struct_line(const table_struct& s) {
    return s.name + " size=" + std::to_string(s.size) + " align=" + std::to_string(s.align) +
           " since=" + std::to_string(s.since);
}

std::string field_line(const table_struct& s, const table_field& f) {
    return s.name + "." + f.name + " offset=" + std::to_string(f.offset) +
           " size=" + std::to_string(f.size) + " since=" + std::to_string(f.since) +
           " role=" + f.role + f.type;
}

const char* const golden_preamble =
    "# nxmem C ABI, major 1: the FROZEN layout of minors 0 to 4.\n"
    "#\n"
    "# This file is the ABI freeze. Plugins already compiled against nxmem_memory_abi.h depend on\n"
    "# every line below; test/abi/header_contract_test.cpp fails if any of them changes. Never\n"
    "# edit, reorder or remove a line. The only permitted change is appending the lines of a new\n"
    "# minor (new structs, or fields appended at the end of a struct), generated by\n"
    "#   scripts/abi-baseline\n"
    "# after raising frozen_through_minor in the test (it runs header_contract_tests\n"
    "# \"[golden-dump]\" with NXMEM_GOLDEN_OUT set, and refuses a dump that drops a line).\n"
    "#\n"
    "# Format, one line per struct followed by one line per field, in declaration order:\n"
    "#   STRUCT size=SIZEOF align=ALIGNOF since=MINOR\n"
    "#   STRUCT.FIELD offset=OFFSET size=SIZEOF since=MINOR role=ROLE type=\"TYPE\"\n"
    "#   STRUCT.SLOT offset=OFFSET size=SIZEOF since=MINOR role=ROLE type=\"FnTYPEDEF\" "
    "signature=\"RET (PARAMS)\"\n"
    "# TYPE is the field's type as the header declares it; a slot (a field whose type is a\n"
    "# function pointer typedef) also records that typedef's signature without parameter names,\n"
    "# so a changed slot signature fails even where offsets and sizes stay the same. Offsets and\n"
    "# sizes are for 64-bit targets (LP64 and LLP64), as the header states. A struct's size line\n"
    "# may grow only when fields of a newer minor are appended after it.\n";

// The golden dump of the current C++ table, restricted to fields of minors up to `through`.
std::vector<std::string> dump_layout(const std::vector<table_struct>& structs,
                                     std::uint32_t through) {
    std::vector<std::string> lines;
    for (const table_struct& s : structs) {
        if (s.since > through) {
            continue;
        }
        // The size the struct had at minor `through`: the end of its last field of that minor,
        // rounded up to its alignment. Fields of newer minors grow sizeof, not the frozen size.
        table_struct frozen = s;
        frozen.size = 0;
        for (const table_field& f : s.fields) {
            if (f.since <= through) {
                frozen.size = std::max(frozen.size, f.offset + f.size);
            }
        }
        frozen.size = (frozen.size + s.align - 1) / s.align * s.align;
        lines.push_back(struct_line(frozen));
        for (const table_field& f : s.fields) {
            if (f.since <= through) {
                lines.push_back(field_line(s, f));
            }
        }
    }
    return lines;
}

struct golden_struct {
    std::size_t size = 0;
    std::size_t align = 0;
    std::uint32_t since = 0;
    std::string line;
};

} // namespace

// ---- the tests ---------------------------------------------------------------------------------

TEST_CASE("the header's layout annotations match the compiler", "[abi][header]") {
    const parsed_header header = parse_header_file();
    for (const std::string& problem : header.problems) {
        FAIL_CHECK(problem);
    }
    REQUIRE(header.structs.size() > 0);

    const std::vector<table_struct> table = describe_all_structs();
    std::map<std::string, const annotated_struct*> annotated;
    for (const annotated_struct& s : header.structs) {
        if (!annotated.emplace(s.name, &s).second) {
            FAIL_CHECK("the header annotates " << s.name << " twice (line " << s.line << ")");
        }
    }
    std::set<std::string> in_table;
    for (const table_struct& s : table) {
        in_table.insert(s.name);
    }
    for (const annotated_struct& s : header.structs) {
        if (in_table.count(s.name) == 0) {
            FAIL_CHECK("the header annotates " << s.name << " (line " << s.line
                                               << ") but nxmem/abi/layout.hpp does not list it in "
                                                  "NXMEM_ABI_STRUCTS");
        }
    }

    for (const table_struct& s : table) {
        INFO("struct " << s.name);
        const auto found = annotated.find(s.name);
        if (found == annotated.end()) {
            FAIL_CHECK(s.name << " is in nxmem/abi/layout.hpp but has no @layout annotation in the "
                                 "header");
            continue;
        }
        const annotated_struct& a = *found->second;
        INFO("header line " << a.line);
        CHECK(a.size == s.size);   // @layout size= against sizeof
        CHECK(a.align == s.align); // @layout align= against alignof
        CHECK(a.since == s.since); // @layout since= against the minor of its first field

        std::vector<std::string> annotated_names;
        std::vector<std::string> table_names;
        for (const annotated_field& f : a.fields) {
            annotated_names.push_back(f.name);
        }
        for (const table_field& f : s.fields) {
            table_names.push_back(f.name);
        }
        // Same fields, same order: a field missing from either side, or moved, shows here.
        CHECK(annotated_names == table_names);

        for (const table_field& f : s.fields) {
            const auto annotation =
                std::find_if(a.fields.begin(), a.fields.end(),
                             [&](const annotated_field& x) { return x.name == f.name; });
            if (annotation == a.fields.end()) {
                continue; // reported by the name comparison above
            }
            INFO("field " << s.name << "." << f.name << " (header line " << annotation->line
                          << ")");
            CHECK(annotation->offset == f.offset); // @field offset= against offsetof
            CHECK(annotation->size == f.size);     // @field size= against sizeof(member)
            CHECK(annotation->since == f.since);   // @field since= against the C++ table's minor
        }
    }
}

TEST_CASE("a C compiler agrees with the annotated layout", "[abi][header][c]") {
    const parsed_header header = parse_header_file();
    for (const std::string& problem : header.problems) {
        FAIL_CHECK(problem);
    }
    REQUIRE(header.structs.size() > 0);

    std::ostringstream tu;
    tu << "/* Generated by header_contract_test.cpp from the header's layout annotations. */\n"
          "#include <stddef.h>\n"
          "#include \"nxmem/nxmem_memory_abi.h\"\n\n";
    std::size_t assertions = 0;
    for (const annotated_struct& s : header.structs) {
        // Every annotated struct also has a typedef name (the vtables are forward-typedef'd).
        tu << "_Static_assert(sizeof(" << s.name << ") == " << s.size << ", \"sizeof(" << s.name
           << ") != " << s.size << "\");\n";
        tu << "_Static_assert(_Alignof(" << s.name << ") == " << s.align << ", \"_Alignof("
           << s.name << ") != " << s.align << "\");\n";
        assertions += 2;
        for (const annotated_field& f : s.fields) {
            tu << "_Static_assert(offsetof(" << s.name << ", " << f.name << ") == " << f.offset
               << ", \"offsetof(" << s.name << ", " << f.name << ") != " << f.offset << "\");\n";
            tu << "_Static_assert(sizeof(((" << s.name << " *)0)->" << f.name << ") == " << f.size
               << ", \"sizeof(" << s.name << "." << f.name << ") != " << f.size << "\");\n";
            assertions += 2;
        }
    }
    const std::string scratch = require_env("NXMEM_SCRATCH_DIR");
    const std::string source = scratch + "/header_contract_layout_asserts.c";
    write_text_file(source, tu.str());
    INFO("generated " << assertions << " assertions in " << source);
    require_compiles(compile_c(source, "header_contract_layout_asserts"));

    SECTION("and the check can fail: one wrong assertion is refused") {
        // A negative control, so that a C compiler that ignores _Static_assert, or a generated
        // file that asserts nothing, cannot pass unnoticed.
        const annotated_struct& last = header.structs.back();
        REQUIRE_FALSE(last.fields.empty());
        const annotated_field& victim = last.fields.back();
        const std::string marker = "nxmem negative control: deliberately wrong offset";
        const std::string wrong_source = scratch + "/header_contract_wrong_assert.c";
        write_text_file(wrong_source, tu.str() + "_Static_assert(offsetof(" + last.name + ", " +
                                          victim.name +
                                          ") == " + std::to_string(victim.offset + 1) + ", \"" +
                                          marker + "\");\n");
        const command_result compiled = compile_c(wrong_source, "header_contract_wrong_assert");
        INFO("command: " << compiled.command);
        INFO("compiler output:\n" << compiled.output);
        REQUIRE(compiled.exit_status != 127); // the compiler must have run
        CHECK(compiled.exit_status != 0);
        // It must fail for the planted reason, not for another one.
        CHECK(compiled.output.find(marker) != std::string::npos);
    }
}

TEST_CASE("the header compiles alone as C11", "[abi][header][c]") {
    const std::string scratch = require_env("NXMEM_SCRATCH_DIR");
    const std::string source = scratch + "/header_contract_header_alone.c";
    write_text_file(source, "#include \"nxmem/nxmem_memory_abi.h\"\n");
    require_compiles(compile_c(source, "header_contract_header_alone"));
}

TEST_CASE("the C plugin helpers header compiles alone as C11", "[abi][header][c]") {
    const std::string scratch = require_env("NXMEM_SCRATCH_DIR");
    const std::string source = scratch + "/header_contract_helpers_alone.c";
    write_text_file(source, "#include \"nxmem/nxmem_plugin_helpers.h\"\n");
    require_compiles(compile_c(source, "header_contract_helpers_alone"));
}

TEST_CASE("the C example compiles against only the header", "[abi][header][c]") {
    // compile_c passes exactly one include directory: the one holding nxmem_memory_abi.h and
    // nxmem_plugin_helpers.h.
    require_compiles(compile_c(require_env("NXMEM_C_EXAMPLE"), "header_contract_c_example"));
}

TEST_CASE("the frozen layout of minors 0 to 4 has not changed", "[abi][header][golden]") {
    const std::string golden_path = require_env("NXMEM_GOLDEN_LAYOUT");
    const std::vector<table_struct> table = describe_contract(read_header_file());
    const std::vector<std::string> current_lines = dump_layout(table, frozen_through_minor);
    const std::set<std::string> current(current_lines.begin(), current_lines.end());

    static const std::regex struct_re(R"(^(\w+) size=(\d+) align=(\d+) since=(\d+)$)");
    static const std::regex field_re(
        R"(^(\w+)\.(\w+) offset=(\d+) size=(\d+) since=(\d+) role=(\w+) type="[^"]+")"
        R"(( signature="[^"]+")?$)");

    std::map<std::string, golden_struct> golden_structs;
    std::set<std::string> golden_fields; // "Struct.field"
    std::size_t golden_line_count = 0;
    INFO(abi_is_frozen);
    INFO("golden file: " << golden_path);

    const std::vector<std::string> golden = split_lines(read_text_file(golden_path));
    for (std::size_t i = 0; i < golden.size(); ++i) {
        const std::string& line = golden[i];
        if (line.empty() || line[0] == '#') {
            continue;
        }
        ++golden_line_count;
        const std::string where = "golden_layout.txt:" + std::to_string(i + 1) + ": `" + line + "`";
        std::smatch match;
        if (std::regex_match(line, match, struct_re)) {
            golden_structs[match[1].str()] = {to_size(match[2].str()), to_size(match[3].str()),
                                              to_u32(match[4].str()), line};
        } else if (std::regex_match(line, match, field_re)) {
            golden_fields.insert(match[1].str() + "." + match[2].str());
        } else {
            FAIL_CHECK(where << " is malformed");
            continue;
        }
        if (current.count(line) != 0) {
            continue;
        }
        // A struct's size line may grow when a newer minor appends fields after the frozen ones;
        // everything else must be present unchanged.
        if (std::regex_match(line, match, struct_re)) {
            const auto now = std::find_if(table.begin(), table.end(), [&](const table_struct& s) {
                return s.name == match[1].str();
            });
            if (now != table.end() && now->align == to_size(match[3].str()) &&
                now->since == to_u32(match[4].str()) && now->size > to_size(match[2].str()) &&
                std::any_of(now->fields.begin(), now->fields.end(),
                            [](const table_field& f) { return f.since > frozen_through_minor; })) {
                WARN(where << " grew to " << now->size << " bytes: fields of a newer minor were "
                           << "appended (checked below)");
                continue;
            }
            FAIL_CHECK(
                where << " no longer holds; the header now says `"
                      << (now == table.end() ? std::string("(struct removed)") : struct_line(*now))
                      << "`");
        } else {
            std::regex_match(line, match, field_re);
            std::string now_text = "(field removed or renamed)";
            for (const table_struct& s : table) {
                for (const table_field& f : s.fields) {
                    if (s.name == match[1].str() && f.name == match[2].str()) {
                        now_text = field_line(s, f);
                    }
                }
            }
            FAIL_CHECK(where << " no longer holds; the header now says `" << now_text << "`");
        }
    }
    REQUIRE(golden_line_count > 0);

    // What the header has that the golden file lacks: only a newer minor may add anything, and
    // only after the frozen bytes of an existing struct.
    for (const table_struct& s : table) {
        const auto frozen = golden_structs.find(s.name);
        if (frozen == golden_structs.end()) {
            if (s.since <= frozen_through_minor) {
                FAIL_CHECK(s.name << " (since=" << s.since
                                  << ") is absent from the golden file, yet "
                                  << "claims a frozen minor");
            } else {
                WARN(s.name << " is a new struct of minor " << s.since << ", not yet frozen");
            }
            continue;
        }
        for (const table_field& f : s.fields) {
            if (golden_fields.count(s.name + "." + f.name) != 0) {
                continue;
            }
            if (f.since <= frozen_through_minor) {
                FAIL_CHECK("`" << field_line(s, f)
                               << "` is absent from the golden file, yet claims "
                               << "frozen minor " << f.since);
            } else if (f.offset < frozen->second.size) {
                FAIL_CHECK("`" << field_line(s, f) << "` of minor " << f.since
                               << " lies inside the " << frozen->second.size << " frozen bytes of "
                               << s.name << "; new fields go after them");
            } else {
                WARN("`" << field_line(s, f) << "` is appended by minor " << f.since
                         << ", after the frozen layout: allowed, not yet frozen");
            }
        }
    }
}

TEST_CASE("slot signatures are read from the header's text, without parameter names",
          "[abi][header][golden]") {
    const std::map<std::string, std::string> types = parse_function_types(
        "typedef NxmemStatusCode (*AFn)(NxmemAllocatorVtable *self,\n"
        "    const NxmemAllocation* allocation, /* why */ uint64_t ticket, NxmemStatus *status);\n"
        "typedef void (*BFn)(void);\n"
        "typedef void(*CFn)(unsigned int, char ** argv, const struct S *);\n");
    REQUIRE(types.size() == 3);
    CHECK(types.at("AFn") ==
          "NxmemStatusCode (NxmemAllocatorVtable *, const NxmemAllocation *, uint64_t, "
          "NxmemStatus *)");
    CHECK(types.at("BFn") == "void (void)");
    CHECK(types.at("CFn") == "void (unsigned int, char **, const struct S *)");
}

TEST_CASE("a changed slot signature changes the golden dump, offsets unchanged",
          "[abi][header][golden]") {
    // The negative control of the golden check for signatures: the same header with one slot
    // parameter narrowed (same size, same offsets) must produce a line the golden file lacks.
    const std::string header = read_header_file();
    const std::string original = "uint64_t *retired";
    const std::size_t at = header.find(original);
    REQUIRE(at != std::string::npos);
    std::string changed = header;
    changed.replace(at, original.size(), "uint32_t *retired");

    const std::vector<std::string> before =
        dump_layout(describe_contract(header), frozen_through_minor);
    const std::vector<std::string> after =
        dump_layout(describe_contract(changed), frozen_through_minor);
    REQUIRE(before.size() == after.size());
    std::vector<std::string> differing;
    for (std::size_t i = 0; i < before.size(); ++i) {
        if (before[i] != after[i]) {
            differing.push_back(after[i]);
        }
    }
    REQUIRE(differing.size() == 1);
    CHECK(differing[0].rfind("NxmemAllocatorVtable.drain_releases offset=104 size=8 ", 0) == 0);
    CHECK(differing[0].find("signature=\"NxmemStatusCode (NxmemAllocatorVtable *, uint32_t *, "
                            "NxmemStatus *)\"") != std::string::npos);
    const std::string golden = read_text_file(require_env("NXMEM_GOLDEN_LAYOUT"));
    CHECK(golden.find(differing[0]) == std::string::npos);
}

// Not run by default: writes the golden dump of the current header to $NXMEM_GOLDEN_OUT.
TEST_CASE("the golden dump of the current header can be printed", "[.][golden-dump]") {
    const std::string out = require_env("NXMEM_GOLDEN_OUT");
    std::string text = golden_preamble;
    const std::vector<table_struct> table = describe_contract(read_header_file());
    for (const std::string& line : dump_layout(table, frozen_through_minor)) {
        if (line.find('.') == std::string::npos) {
            text += "\n"; // a blank line before each struct, for the reader
        }
        text += line + "\n";
    }
    write_text_file(out, text);
}

TEST_CASE("the header refuses to compile for a 32-bit target", "[abi][header][c]") {
    // Rule L4. -ffreestanding: only the compiler's own <stddef.h> and <stdint.h> are needed, so
    // no 32-bit C library has to be installed; a compiler without a 32-bit x86 target cannot
    // show the refusal, and the test says so instead of guessing.
    const std::string compiler = require_env("NXMEM_C_COMPILER");
    const std::string include_dir = require_env("NXMEM_INCLUDE_DIR");
    const std::string scratch = require_env("NXMEM_SCRATCH_DIR");
    const std::string source = scratch + "/header_contract_32_bit.c";
    write_text_file(source, "#include \"nxmem/nxmem_memory_abi.h\"\n");
    const auto compile = [&](const std::string& target, const std::string& file, const std::string& stem) {
        return run_command(compiler + " -std=c11 -ffreestanding -fsyntax-only " + target + " -I " +
                               shell_quote(include_dir) + " " + shell_quote(file),
                           scratch + "/" + stem + ".log");
    };
    const std::string empty = scratch + "/header_contract_empty.c";
    write_text_file(empty, "typedef int translation_unit_is_not_empty;\n");
    const command_result probe = compile("-m32", empty, "header_contract_m32_probe");
    if (probe.exit_status != 0) {
        WARN("the C compiler cannot target 32-bit x86 (" << probe.command << "):\n" << probe.output
                                                          << "so L4 is not checked in this build");
        return;
    }
    const command_result refused = compile("-m32", source, "header_contract_32_bit");
    INFO("command: " << refused.command);
    INFO("compiler output:\n" << refused.output);
    CHECK(refused.exit_status != 0);
    CHECK(refused.output.find("the nxmem ABI is defined for 64-bit targets only") != std::string::npos);
    // The control: the same command for this (64-bit) target compiles.
    require_compiles(compile("", source, "header_contract_64_bit"));
}
