// The replay runner: the harness's entry point linked into an ordinary executable (no libFuzzer),
// run once per corpus file, so every build, GCC and the sanitizer builds included, replays the
// committed corpora as a plain Meson test.
// Usage: fuzz_replay_NAME PATH...   (a directory stands for every regular file under it)
#include "fuzz_support.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::vector<std::filesystem::path> corpus_files(const std::filesystem::path& root) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(root)) {
        for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
            if (entry.is_regular_file() && entry.path().filename().string().front() != '.') {
                files.push_back(entry.path());
            }
        }
    } else {
        files.push_back(root);
    }
    std::sort(files.begin(), files.end()); // a deterministic order, so a failure names one file
    return files;
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::cerr << "usage: " << argv[0] << " CORPUS_DIR_OR_FILE...\n";
        return 2;
    }
    std::size_t replayed = 0;
    for (int arg = 1; arg < argc; ++arg) {
        for (const std::filesystem::path& file : corpus_files(argv[arg])) {
            std::ifstream in(file, std::ios::binary);
            if (!in) {
                std::cerr << "cannot read " << file << "\n";
                return 1;
            }
            const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in),
                                                  std::istreambuf_iterator<char>()};
            // An abort inside names the file last printed.
            std::cerr << "replaying " << file.string() << " (" << bytes.size() << " bytes)\n";
            LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
            ++replayed;
        }
    }
    if (replayed == 0) {
        std::cerr << "no corpus files found: an empty corpus replays nothing\n";
        return 1;
    }
    std::cout << "replayed " << replayed << " inputs\n";
    return 0;
}
