// placeholder, replaced by the lead's importer within the hour
#include "importer/importer.h"
#include "graph/error.h"
namespace apart {
ImportedModel import_model(const std::filesystem::path&, const ImportOptions&) { throw Unsupported("importer not built yet"); }
ImportedModel import_model_bytes(const std::string&, const std::filesystem::path&, const std::string&, const ImportOptions&) { throw Unsupported("importer not built yet"); }
std::pair<std::string, std::vector<int64_t>> parse_shape_flag(const std::string&) { throw Unsupported("x"); }
std::pair<std::string, int64_t> parse_dim_flag(const std::string&) { throw Unsupported("x"); }
}
