#include "client/cli/diagnosis_printer.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace attnaudit::client {

std::string FormatDiagnosis(const AuditReport& r) {
  const DiagnosisRun& run = r.diagnosis_run;
  if (!run.ran) {
    return run.note.empty() ? "" : absl::StrCat("diagnosis: ", run.note, "\n");
  }
  std::string out;
  if (r.diagnoses.empty()) {
    absl::StrAppend(&out, "diagnosis: ",
                    run.note.empty() ? "nothing to diagnose" : run.note, "\n");
    return out;
  }
  absl::StrAppend(&out, "\ndiagnosis: ", r.diagnoses[0].summary, "\n");
  std::vector<std::string> others;
  for (size_t i = 1; i < r.diagnoses.size(); ++i) {
    const Diagnosis& d = r.diagnoses[i];
    others.push_back(absl::StrFormat("%s %.0f%%", d.hypothesis, 100 * d.score));
  }
  if (!others.empty()) {
    absl::StrAppend(&out, "    also considered: ", absl::StrJoin(others, ", "),
                    "\n");
  }
  absl::StrAppendFormat(&out, "    (%d rows examined, %d hypotheses%s)\n",
                        run.rows, run.hypotheses,
                        run.complete ? "" : absl::StrCat("; ", run.note));
  return out;
}

}  // namespace attnaudit::client
