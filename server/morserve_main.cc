// The `morserve` command line: dispatches to the subcommands of engine/tools.
#include <cstdio>
#include <cstring>
#include <string>

#include "engine/tools/commands.h"
#ifdef MORSERVE_HAVE_SERVER
#include "server/serve.h"
#endif

namespace {

struct Command {
  const char* name;
  int (*run)(const morserve::Args&);
  const char* help;
};

const Command kCommands[] = {
    {"inspect", morserve::InspectCommand, "DIR: print the layer plan, parameters and KV sizes"},
    {"mkmodel", morserve::MkmodelCommand, "--family F --out DIR: write a random tiny model"},
    {"generate", morserve::GenerateCommand, "--model DIR --prompt-ids 1,2,3: run the engine"},
    {"bench", morserve::BenchCommand, "--models DIR[,DIR]: decode throughput protocol (JSON)"},
    {"tokenize", morserve::TokenizeCommand, "--model DIR TEXT | --decode 1,2,3: tokenizer.json"},
    {"convert", morserve::ConvertCommand, "--from DIR --out DIR ...: vanilla -> Recursive, MoR run"},
    {"mktokenizer", morserve::MktokenizerCommand,
     "--corpus F[,F] --vocab-size N --out DIR: train a byte-level BPE tokenizer"},
#ifdef MORSERVE_HAVE_SERVER
    {"serve", morserve::ServeCommand, "--model DIR --port P: gRPC server with Prometheus metrics"},
#endif
};

int Usage() {
  std::fprintf(stderr, "usage: morserve COMMAND [ARGS]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(stderr, "  %-12s %s\n", c.name, c.help);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(morserve::Args(argv + 2, argv + argc));
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) return Usage();
  std::fprintf(stderr, "morserve: unknown command '%s'\n", argv[1]);
  return Usage();
}
