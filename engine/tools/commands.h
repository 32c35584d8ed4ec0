// Subcommands of the `morserve` CLI. Each takes the arguments after its name and returns
// the process exit code; usage errors print a message and return 2.
#pragma once

#include <string>
#include <vector>

namespace morserve {

using Args = std::vector<std::string>;

int InspectCommand(const Args& args);   // morserve inspect DIR
int MkmodelCommand(const Args& args);   // morserve mkmodel --family F --out DIR [...]
int GenerateCommand(const Args& args);  // morserve generate --model DIR --prompt-ids ...
int BenchCommand(const Args& args);     // morserve bench --models DIR[,DIR...] [...]
int TokenizeCommand(const Args& args);  // morserve tokenize --model DIR [--json] TEXT
int ConvertCommand(const Args& args);   // morserve convert --from DIR --out DIR [...]
int MktokenizerCommand(const Args& args);  // morserve mktokenizer --corpus F --vocab-size N ...

}  // namespace morserve
