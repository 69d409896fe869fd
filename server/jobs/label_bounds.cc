#include "server/jobs/label_bounds.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace attnaudit::server {

bool BoundLabelValue(std::string* value) {
  const bool truncate = value->size() > kMaxLabelBytes;
  if (truncate) {
    value->resize(kMaxLabelBytes - kTruncationMarker.size());
  }
  for (char& c : *value) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        !absl::StrContains(" ._:/@+=#~-", c)) {
      c = '_';
    }
  }
  if (truncate)
    value->append(kTruncationMarker.data(), kTruncationMarker.size());
  return truncate;
}

LabelTruncations BoundLabels(Labels* labels) {
  LabelTruncations t;
  t.model = BoundLabelValue(&labels->model);
  t.engine = BoundLabelValue(&labels->engine);
  t.backend = BoundLabelValue(&labels->backend);
  t.run = BoundLabelValue(&labels->run);
  t.weight_version = BoundLabelValue(&labels->weight_version);
  for (std::string& id : labels->request_ids) {
    t.request_ids += BoundLabelValue(&id);
  }
  return t;
}

}  // namespace attnaudit::server
