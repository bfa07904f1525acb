// The model_type -> family registry, read from each family's kModelTypes.
#include "card/family.h"

namespace slidedp {
namespace {

// Calls visit(Family{}) for each alternative of ModelFamily, in order.
template <typename Visit, typename... Families>
void for_each_family(Visit&& visit, std::variant<Families...>* /*tag*/) {
  (visit(Families{}), ...);
}

}  // namespace

std::optional<ModelFamily> family_of_model_type(std::string_view model_type) {
  std::optional<ModelFamily> found;
  for_each_family(
      [&](auto family) {
        for (std::string_view t : decltype(family)::kModelTypes)
          if (t == model_type) found = family;
      },
      static_cast<ModelFamily*>(nullptr));
  return found;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> types;
  for_each_family(
      [&](auto family) {
        for (std::string_view t : decltype(family)::kModelTypes) types.emplace_back(t);
      },
      static_cast<ModelFamily*>(nullptr));
  return types;
}

}  // namespace slidedp
