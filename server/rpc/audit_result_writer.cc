#include "server/rpc/audit_result_writer.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "server/common/log.h"

namespace attnaudit::server {

AuditResultWriter::AuditResultWriter(Options options, Store store,
                                     ResultJournal* journal)
    : options_(options), store_(std::move(store)), journal_(journal) {
  if (journal_ != nullptr) {
    // Results an earlier run journalled: drained first.
    absl::StatusOr<std::vector<std::string>> ids = journal_->Ids();
    absl::MutexLock lock(&mu_);
    journalled_ = ids.ok() ? static_cast<int64_t>(ids->size()) : 0;
    drain_now_ = journalled_ > 0;
  }
  thread_ = std::thread([this] { Loop(); });
}

AuditResultWriter::~AuditResultWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    journal_only_ = true;  // what is queued goes to the journal at once
  }
  thread_.join();
}

void AuditResultWriter::Add(ResultRecord record, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (queue_.size() < options_.capacity) {
      queue_.push_back(Item{std::move(record), std::move(done)});
      return;
    }
    if (overflowed_++ == 0) {
      ATTNAUDIT_LOG(warn,
                    "Audit results arrive faster than the store takes them; "
                    "the excess is answered as not stored");
    }
  }
  done(record, /*kept=*/false);
}

void AuditResultWriter::StoreAnswered() {
  absl::MutexLock lock(&mu_);
  if (journalled_ > 0) drain_now_ = true;
}

void AuditResultWriter::JournalOnly() {
  absl::MutexLock lock(&mu_);
  journal_only_ = true;
}

int64_t AuditResultWriter::overflowed() const {
  absl::MutexLock lock(&mu_);
  return overflowed_;
}

int64_t AuditResultWriter::journalled() const {
  absl::MutexLock lock(&mu_);
  return journalled_;
}

bool AuditResultWriter::JournalModeLocked() const {
  // A store that failed is not tried per result while results wait in the
  // journal: the drain tries it (and with an empty journal, the next
  // result does).
  return journal_only_ || journalled_ > 0;
}

bool AuditResultWriter::Journal(const ResultRecord& record) {
  if (journal_ == nullptr) return false;
  absl::Status s = journal_->Append(record);
  if (!s.ok()) {
    ATTNAUDIT_LOG(err, "result neither stored nor journalled")
        .Kv("job_id", record.job_id)
        .Kv("status", s);
    return false;
  }
  absl::MutexLock lock(&mu_);
  ++journalled_;
  return true;
}

void AuditResultWriter::KeepAll(std::vector<Item> items) {
  std::vector<ResultRecord> records;
  records.reserve(items.size());
  for (Item& item : items) records.push_back(std::move(item.record));
  bool journal_mode;
  {
    absl::MutexLock lock(&mu_);
    journal_mode = JournalModeLocked() && journal_ != nullptr;
  }
  bool stored = false;
  if (!journal_mode) {
    const absl::Status s = store_(records);
    stored = s.ok();
    bool first = false;
    if (!stored) {
      absl::MutexLock lock(&mu_);
      first = !store_down_;
      store_down_ = true;
    }
    if (first) {
      ATTNAUDIT_LOG(warn,
                    "result store refused Audit results; journalling results "
                    "until it takes them")
          .Kv("results", static_cast<int64_t>(records.size()))
          .Kv("status", s);
    }
  }
  for (size_t i = 0; i < records.size(); ++i) {
    items[i].done(records[i], stored || Journal(records[i]));
  }
}

void AuditResultWriter::DrainJournal() {
  absl::StatusOr<std::vector<std::string>> ids = journal_->Ids();
  if (!ids.ok()) return;
  for (size_t from = 0; from < ids->size(); from += kBatch) {
    std::vector<std::string> batch;
    std::vector<ResultRecord> records;
    for (size_t i = from; i < std::min(ids->size(), from + kBatch); ++i) {
      absl::StatusOr<ResultRecord> record = journal_->Read((*ids)[i]);
      if (record.ok()) {
        records.push_back(*std::move(record));
      } else if (record.status().code() != absl::StatusCode::kNotFound) {
        ATTNAUDIT_LOG(err, "journalled result unreadable; quarantined")
            .Kv("job_id", (*ids)[i])
            .Kv("status", record.status());
      }
      batch.push_back((*ids)[i]);
    }
    if (!records.empty() && !store_(records).ok()) {
      absl::MutexLock lock(&mu_);
      store_down_ = true;
      return;  // the next period tries again, from this batch
    }
    for (const std::string& id : batch) journal_->Remove(id).IgnoreError();
    absl::MutexLock lock(&mu_);
    journalled_ =
        std::max<int64_t>(0, journalled_ - static_cast<int64_t>(batch.size()));
  }
  absl::MutexLock lock(&mu_);
  if (journalled_ == 0 && store_down_) {
    ATTNAUDIT_LOG(info, "result store back; result journal drained");
    store_down_ = false;
  }
}

void AuditResultWriter::Loop() {
  absl::Time last_drain = absl::Now();
  while (true) {
    std::vector<Item> next;
    bool drain = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_ || drain_now_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), options_.retry_period);
      while (!queue_.empty() && next.size() < kBatch) {
        next.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      if (next.empty() && stopping_) return;
      // Due even while results keep coming: they queue behind the drain.
      drain = journal_ != nullptr && journalled_ > 0 && !journal_only_ &&
              (drain_now_ || absl::Now() - last_drain >= options_.retry_period);
      if (drain) drain_now_ = false;
    }
    if (drain) {
      DrainJournal();
      last_drain = absl::Now();
    }
    if (!next.empty()) KeepAll(std::move(next));
  }
}

}  // namespace attnaudit::server
