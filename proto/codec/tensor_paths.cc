#include "proto/codec/tensor_paths.h"

namespace attnaudit {
namespace {

// One tensor field, reachable in both representations.
struct TensorField {
  absl::string_view path;
  const v1::Tensor* (*find)(const v1::Snapshot&);  // nullptr when unset
  v1::Tensor* (*mutable_field)(v1::Snapshot*);
  Tensor* (*core)(Snapshot*);
};

// Top-level and nested fields: has_x() must gate x() so an unset field is
// reported as nullptr, not as the default instance.
// clang-format off
#define ATTNAUDIT_TOP(name)                                              \
  TensorField {                                                          \
    #name,                                                               \
        [](const v1::Snapshot& m) -> const v1::Tensor* {                 \
          return m.has_##name() ? &m.name() : nullptr;                   \
        },                                                               \
        [](v1::Snapshot* m) { return m->mutable_##name(); },             \
        [](Snapshot* s) { return &s->name; }                             \
  }
#define ATTNAUDIT_NESTED(parent, name)                                   \
  TensorField {                                                          \
    #parent "." #name,                                                   \
        [](const v1::Snapshot& m) -> const v1::Tensor* {                 \
          return m.has_##parent() && m.parent().has_##name()             \
                     ? &m.parent().name()                                \
                     : nullptr;                                          \
        },                                                               \
        [](v1::Snapshot* m) {                                            \
          return m->mutable_##parent()->mutable_##name();                \
        },                                                               \
        [](Snapshot* s) { return &s->parent.name; }                      \
  }
// clang-format on

const TensorField kFields[] = {
    ATTNAUDIT_TOP(q),
    ATTNAUDIT_TOP(k_pages),
    ATTNAUDIT_TOP(v_pages),
    ATTNAUDIT_TOP(k_scale),
    ATTNAUDIT_TOP(v_scale),
    ATTNAUDIT_TOP(page_ids),
    ATTNAUDIT_TOP(block_table),
    ATTNAUDIT_TOP(kv_seq_lens),
    ATTNAUDIT_TOP(query_positions),
    ATTNAUDIT_TOP(slot_positions),
    ATTNAUDIT_TOP(key_rope_positions),
    ATTNAUDIT_TOP(sinks),
    ATTNAUDIT_NESTED(cp, block_owners),
    ATTNAUDIT_NESTED(cp, rank_out),
    ATTNAUDIT_NESTED(cp, rank_lse),
    ATTNAUDIT_NESTED(engine, out),
    ATTNAUDIT_NESTED(engine, lse),
    ATTNAUDIT_NESTED(engine, logprobs),
    ATTNAUDIT_TOP(selected_token_ids),
    ATTNAUDIT_TOP(lm_head),
    ATTNAUDIT_TOP(active_mask),
    ATTNAUDIT_NESTED(pre_rope, q),
    ATTNAUDIT_NESTED(pre_rope, k),
    ATTNAUDIT_NESTED(rope_table, inv_freq),
    ATTNAUDIT_NESTED(rope_table, positions),
    ATTNAUDIT_NESTED(rope_table, cos),
    ATTNAUDIT_NESTED(rope_table, sin),
};

#undef ATTNAUDIT_TOP
#undef ATTNAUDIT_NESTED

const TensorField* Lookup(absl::string_view path) {
  for (const TensorField& field : kFields) {
    if (field.path == path) return &field;
  }
  return nullptr;
}

}  // namespace

const std::vector<absl::string_view>& SnapshotTensorPaths() {
  static const auto* const paths = [] {
    auto* v = new std::vector<absl::string_view>;
    for (const TensorField& field : kFields) v->push_back(field.path);
    return v;
  }();
  return *paths;
}

const v1::Tensor* FindSnapshotTensor(const v1::Snapshot& msg,
                                     absl::string_view path) {
  const TensorField* field = Lookup(path);
  return field ? field->find(msg) : nullptr;
}

v1::Tensor* MutableSnapshotTensor(v1::Snapshot* msg, absl::string_view path) {
  const TensorField* field = Lookup(path);
  return field ? field->mutable_field(msg) : nullptr;
}

const Tensor* FindSnapshotTensor(const Snapshot& snapshot,
                                 absl::string_view path) {
  const TensorField* field = Lookup(path);
  // The accessor only takes an address; it never writes.
  return field ? field->core(const_cast<Snapshot*>(&snapshot)) : nullptr;
}

Tensor* MutableSnapshotTensor(Snapshot* snapshot, absl::string_view path) {
  const TensorField* field = Lookup(path);
  return field ? field->core(snapshot) : nullptr;
}

}  // namespace attnaudit
