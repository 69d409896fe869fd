// The fault registry (sim/fault_registry.h) against what must exist for
// each of its rows: a hypothesis the diagnosis knows (core/diagnosis
// HypothesisNames()), a row in docs/SIMULATOR.md's fault tables, and a row
// for that hypothesis in docs/DIAGNOSIS.md's catalogue. These are the steps
// of docs/EXTENDING.md, "A fault class", that no compiler checks.
// ATTNAUDIT_DOCS_DIR (set by ctest) names the docs folder.
#include "sim/fault_registry.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "core/diagnosis/diagnosis.h"
#include "gtest/gtest.h"
#include "sim/simulator.h"

namespace attnaudit {
namespace {

bool IsHypothesis(const std::string& name) {
  const std::vector<std::string>& names = HypothesisNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(FaultRegistryTest, NamesAreUniqueAndParseBackToTheirRow) {
  std::set<std::string> seen;
  for (const FaultInfo& row : FaultRegistry()) {
    EXPECT_TRUE(seen.insert(row.name).second) << row.name;
    EXPECT_NE(std::string(row.name), "none");
    if (row.is_cp()) {
      EXPECT_EQ(row.fault, Fault::kNone) << row.name;
      EXPECT_EQ(ParseCpFault(row.name).value(), row.cp_fault);
      EXPECT_EQ(CpFaultName(row.cp_fault), row.name);
      EXPECT_EQ(FindCpFault(row.cp_fault), &row);
    } else {
      EXPECT_NE(row.fault, Fault::kNone);
      EXPECT_EQ(ParseFault(row.name).value(), row.fault);
      EXPECT_EQ(FaultName(row.fault), row.name);
      EXPECT_EQ(FindFault(row.fault), &row);
    }
  }
  EXPECT_EQ(FindFault(Fault::kNone), nullptr);
  EXPECT_EQ(FindCpFault(CpFault::kNone), nullptr);
  EXPECT_EQ(FaultNames().size() + CpFaultNames().size(),
            FaultRegistry().size());
}

TEST(FaultRegistryTest, EveryFaultHasAHypothesisTheDiagnosisKnows) {
  for (const FaultInfo& row : FaultRegistry()) {
    if (row.hypothesis == nullptr) {
      // Only a fault the engine's final output does not show may go
      // without one: a CP rank's own partial, which the rank check names.
      EXPECT_EQ(row.site, FaultSite::kCpRank) << row.name;
      continue;
    }
    EXPECT_TRUE(IsHypothesis(row.hypothesis))
        << row.name << " expects '" << row.hypothesis
        << "', which is not in HypothesisNames() (core/diagnosis)";
    EXPECT_NE(std::string(row.hypothesis), "unexplained") << row.name;
  }
}

TEST(FaultRegistryTest, SitesMatchTheKindOfFault) {
  for (const FaultInfo& row : FaultRegistry()) {
    const bool cp_site =
        row.site == FaultSite::kCpRank || row.site == FaultSite::kCpCombine;
    EXPECT_EQ(cp_site, row.is_cp()) << row.name;
  }
}

// --- The docs. ---

// The backticked names in the first cell of every row of the markdown
// table whose header line is `header`.
std::set<std::string> FirstColumnNames(const std::string& markdown,
                                       const std::string& header) {
  std::set<std::string> names;
  std::istringstream in(markdown);
  std::string line;
  bool in_table = false, separator = false;
  while (std::getline(in, line)) {
    if (!in_table) {
      in_table = line == header;
      separator = in_table;
      continue;
    }
    if (separator) {  // |---|---|
      separator = false;
      continue;
    }
    if (!absl::StartsWith(line, "|")) break;
    const std::string cell = line.substr(1, line.find('|', 1) - 1);
    for (size_t a = cell.find('`'); a != std::string::npos;) {
      const size_t b = cell.find('`', a + 1);
      if (b == std::string::npos) break;
      names.insert(cell.substr(a + 1, b - a - 1));
      a = cell.find('`', b + 1);
    }
  }
  return names;
}

std::string ReadDoc(const std::string& name) {
  const char* dir = std::getenv("ATTNAUDIT_DOCS_DIR");
  if (dir == nullptr) {
    ADD_FAILURE() << "ATTNAUDIT_DOCS_DIR is not set (ctest sets it)";
    return "";
  }
  std::ifstream in(std::string(dir) + "/" + name);
  EXPECT_TRUE(in.good()) << dir << "/" << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

constexpr char kFaultTable[] =
    "| fault | what the engine does | invisible when |";
constexpr char kCpFaultTable[] = "| fault | what the engine does | needs |";
constexpr char kCatalogue[] =
    "| hypothesis | what the buggy engine does | how it is evaluated | "
    "location |";

// Names in `want` without a row, and rows in `have` that name nothing
// registered, as one message ("" when they agree).
std::string Mismatch(const std::set<std::string>& want,
                     const std::set<std::string>& have) {
  std::vector<std::string> missing, extra;
  for (const std::string& w : want) {
    if (!have.count(w)) missing.push_back(w);
  }
  for (const std::string& h : have) {
    if (!want.count(h)) extra.push_back(h);
  }
  if (missing.empty() && extra.empty()) return "";
  return "no row for: [" + absl::StrJoin(missing, ", ") +
         "]; rows for no registered fault: [" + absl::StrJoin(extra, ", ") +
         "]";
}

TEST(FaultDocsTest, TheTableReaderSeesEveryRowAndOnlyThem) {
  // A planted table: a row per name, two names in one cell, a row without
  // a backticked name, and text after the table that must not count.
  const std::string md = std::string("intro `not-a-row`\n\n") + kFaultTable +
                         "\n|---|---|---|\n"
                         "| `a-fault` | x | y |\n"
                         "| `b-fault`, `c-fault` | x | `not-first` |\n"
                         "| plain | x | y |\n"
                         "\nafter `d-fault`\n| `e-fault` | x | y |\n";
  EXPECT_EQ(FirstColumnNames(md, kFaultTable),
            (std::set<std::string>{"a-fault", "b-fault", "c-fault"}));
  EXPECT_NE(Mismatch({"a-fault", "b-fault", "c-fault", "new-fault"},
                     FirstColumnNames(md, kFaultTable)),
            "");
  EXPECT_TRUE(FirstColumnNames(md, kCpFaultTable).empty());
}

TEST(FaultDocsTest, EveryFaultHasARowInSimulatorMd) {
  const std::string md = ReadDoc("SIMULATOR.md");
  std::set<std::string> faults, cp_faults;
  for (const FaultInfo& row : FaultRegistry()) {
    (row.is_cp() ? cp_faults : faults).insert(row.name);
  }
  EXPECT_EQ(Mismatch(faults, FirstColumnNames(md, kFaultTable)), "")
      << "docs/SIMULATOR.md, \"Faults\"";
  EXPECT_EQ(Mismatch(cp_faults, FirstColumnNames(md, kCpFaultTable)), "")
      << "docs/SIMULATOR.md, \"Context parallelism\"";
}

TEST(FaultDocsTest, EveryExpectedHypothesisHasARowInDiagnosisMd) {
  const std::set<std::string> rows =
      FirstColumnNames(ReadDoc("DIAGNOSIS.md"), kCatalogue);
  ASSERT_FALSE(rows.empty()) << "docs/DIAGNOSIS.md: no catalogue table";
  for (const FaultInfo& row : FaultRegistry()) {
    if (row.hypothesis == nullptr) continue;
    EXPECT_TRUE(rows.count(row.hypothesis))
        << row.name << " expects '" << row.hypothesis
        << "', which has no row in docs/DIAGNOSIS.md, \"The catalogue\"";
  }
}

TEST(FaultDocsTest, EveryHypothesisNameIsInDiagnosisMd) {
  // The catalogue's rows, or (the RoPE checks' names) its text.
  const std::string md = ReadDoc("DIAGNOSIS.md");
  for (const std::string& name : HypothesisNames()) {
    EXPECT_NE(md.find("`" + name + "`"), std::string::npos)
        << name << " is not named in docs/DIAGNOSIS.md";
  }
}

}  // namespace
}  // namespace attnaudit
