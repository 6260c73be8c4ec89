// Aligned columns for the human-readable reports. A row with fewer cells than the header lets its
// last cell run on to the end of the line (used for "refused: ..." rows); such a spanning cell
// does not widen its column.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace nxmem::tool {

class text_table {
public:
    enum class align { left, right };

    struct column {
        std::string heading;
        align alignment = align::left;
    };

    explicit text_table(std::vector<column> columns);

    void add_row(std::vector<std::string> cells);

    // Every line starts with `indent`; columns are separated by two spaces; no trailing spaces.
    void print(std::ostream& out, const std::string& indent) const;

private:
    std::vector<column> columns_;
    std::vector<std::vector<std::string>> rows_;
};

} // namespace nxmem::tool
