#include "text_table.hpp"

#include <range/v3/range/conversion.hpp>
#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/transform.hpp>

#include <algorithm>
#include <utility>

namespace nxmem::tool {

text_table::text_table(std::vector<column> columns) : columns_(std::move(columns)) {}

void text_table::add_row(std::vector<std::string> cells) {
    cells.resize(std::min(cells.size(), columns_.size()));
    rows_.push_back(std::move(cells));
}

void text_table::print(std::ostream& out, const std::string& indent) const {
    const std::vector<std::string> headings =
        columns_ | ranges::views::transform(&column::heading) | ranges::to<std::vector>();
    std::vector<std::size_t> widths =
        headings | ranges::views::transform(&std::string::size) | ranges::to<std::vector>();
    for (const std::vector<std::string>& row : rows_) {
        // A short row's last cell spans the remaining columns and widens none of them.
        const bool spans = row.size() < columns_.size();
        for (const auto& [i, cell] : ranges::views::enumerate(row)) {
            if (!(spans && i + 1 == row.size())) {
                widths[i] = std::max(widths[i], cell.size());
            }
        }
    }
    const auto print_line = [&](const std::vector<std::string>& cells) {
        std::string line = indent;
        for (const auto& [i, cell] : ranges::views::enumerate(cells)) {
            const bool last = i + 1 == cells.size();
            const std::size_t pad = cell.size() < widths[i] ? widths[i] - cell.size() : 0;
            if (i > 0) {
                line += "  ";
            }
            if (columns_[i].alignment == align::right) {
                line.append(pad, ' ');
                line += cell;
            } else {
                line += cell;
                if (!last) {
                    line.append(pad, ' ');
                }
            }
        }
        out << line << '\n';
    };
    print_line(headings);
    for (const std::vector<std::string>& row : rows_) {
        print_line(row);
    }
}

} // namespace nxmem::tool
