#include "text_table.hpp"

#include <algorithm>
#include <utility>

namespace nxmem::tool {

text_table::text_table(std::vector<column> columns) : columns_(std::move(columns)) {}

void text_table::add_row(std::vector<std::string> cells) {
    cells.resize(std::min(cells.size(), columns_.size()));
    rows_.push_back(std::move(cells));
}

void text_table::print(std::ostream& out, const std::string& indent) const {
    std::vector<std::size_t> widths(columns_.size());
    for (std::size_t i = 0; i < columns_.size(); ++i) {
        widths[i] = columns_[i].heading.size();
    }
    for (const std::vector<std::string>& row : rows_) {
        const bool spans = row.size() < columns_.size();
        for (std::size_t i = 0; i < row.size(); ++i) {
            if (!(spans && i + 1 == row.size())) {
                widths[i] = std::max(widths[i], row[i].size());
            }
        }
    }
    const auto print_line = [&](const std::vector<std::string>& cells) {
        std::string line = indent;
        for (std::size_t i = 0; i < cells.size(); ++i) {
            const bool last = i + 1 == cells.size();
            const std::size_t pad = cells[i].size() < widths[i] ? widths[i] - cells[i].size() : 0;
            if (i > 0) {
                line += "  ";
            }
            if (columns_[i].alignment == align::right) {
                line.append(pad, ' ');
                line += cells[i];
            } else {
                line += cells[i];
                if (!last) {
                    line.append(pad, ' ');
                }
            }
        }
        out << line << '\n';
    };
    std::vector<std::string> headings;
    for (const column& heading : columns_) {
        headings.push_back(heading.heading);
    }
    print_line(headings);
    for (const std::vector<std::string>& row : rows_) {
        print_line(row);
    }
}

} // namespace nxmem::tool
