#include "server/rpc/result_journal.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/spool/spool_record.pb.h"

namespace attnaudit::server {
namespace {

using spool::JournalledResult;

int64_t Micros(absl::Time t) { return absl::ToUnixMicros(t); }

std::string Encode(const ResultRecord& r) {
  JournalledResult m;
  m.set_job_id(r.job_id);
  m.set_tenant(r.tenant);
  m.set_state(static_cast<int32_t>(r.state));
  m.set_verdict(r.verdict);
  m.set_priority(r.priority);
  m.set_model(r.model);
  m.set_layer(r.layer);
  m.set_engine(r.engine);
  m.set_backend(r.backend);
  m.set_step(r.step);
  m.set_run(r.run);
  m.set_diagnosis(r.diagnosis);
  m.set_replica(r.replica);
  m.set_created_unix_micros(Micros(r.created));
  m.set_started_unix_micros(Micros(r.started));
  m.set_finished_unix_micros(Micros(r.finished));
  m.set_error_code(r.error_code);
  m.set_error_message(r.error_message);
  m.set_report(r.report);
  m.set_bytes_total(r.bytes);
  return m.SerializeAsString();
}

absl::StatusOr<ResultRecord> Decode(absl::string_view bytes) {
  JournalledResult m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("journal entry does not hold a result");
  }
  ResultRecord r;
  r.job_id = m.job_id();
  r.tenant = m.tenant();
  r.state = static_cast<JobState>(m.state());
  if (!IsTerminal(r.state)) {
    return absl::DataLossError("journal entry holds an unfinished job");
  }
  r.verdict = m.verdict();
  r.priority = m.priority();
  r.model = m.model();
  r.layer = m.layer();
  r.engine = m.engine();
  r.backend = m.backend();
  r.step = m.step();
  r.run = m.run();
  r.diagnosis = m.diagnosis();
  r.replica = m.replica();
  r.created = absl::FromUnixMicros(m.created_unix_micros());
  r.started = absl::FromUnixMicros(m.started_unix_micros());
  r.finished = absl::FromUnixMicros(m.finished_unix_micros());
  r.error_code = m.error_code();
  r.error_message = m.error_message();
  r.report = m.report();
  r.bytes = m.bytes_total();
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResultJournal>> ResultJournal::Open(
    const std::string& data_dir, const Options& options) {
  if (options.max_bytes < 1) {
    return absl::InvalidArgumentError("max_bytes: must be >= 1");
  }
  SpoolOptions spool;
  spool.subdir = "journal";
  spool.max_total_bytes = options.max_bytes;
  spool.max_payload_bytes = options.max_bytes;
  spool.sync = options.sync;
  absl::StatusOr<std::unique_ptr<Spool>> opened = Spool::Open(data_dir, spool);
  if (!opened.ok()) return opened.status();
  return std::unique_ptr<ResultJournal>(new ResultJournal(*std::move(opened)));
}

absl::Status ResultJournal::Append(const ResultRecord& record) {
  if (!IsTerminal(record.state)) {
    return absl::InvalidArgumentError("state: only finished jobs' results");
  }
  SpoolMetadata meta;  // for the spool's listing order and logs
  meta.created = record.finished;
  meta.model = record.model;
  meta.layer = record.layer;
  meta.engine = record.engine;
  meta.tenant = record.tenant;
  absl::Status s = spool_->Put(record.job_id, meta, Encode(record));
  // A payload over the limit is the journal being too small for it.
  if (s.code() == absl::StatusCode::kInvalidArgument &&
      absl::StartsWith(s.message(), "payload:")) {
    return absl::ResourceExhaustedError(s.message());
  }
  return s;
}

absl::StatusOr<std::vector<std::string>> ResultJournal::Ids() {
  absl::StatusOr<std::vector<SpoolListing>> listing = spool_->List();
  if (!listing.ok()) return listing.status();
  std::vector<std::string> ids;
  ids.reserve(listing->size());
  for (const SpoolListing& l : *listing) ids.push_back(l.job_id);
  return ids;
}

absl::StatusOr<ResultRecord> ResultJournal::Read(absl::string_view job_id) {
  absl::StatusOr<SpoolEntry> entry = spool_->Read(job_id);
  if (!entry.ok()) return entry.status();
  return Decode(entry->payload);
}

absl::Status ResultJournal::Remove(absl::string_view job_id) {
  return spool_->Remove(job_id);
}

}  // namespace attnaudit::server
