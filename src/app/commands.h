// The `ember` subcommands. Each takes the full argv and the index of its first own argument,
// prints its result to stdout and errors to stderr, and returns the process exit code.
// Only main.cc calls these; nothing below app/ may exit().
#pragma once

namespace ember::app {

int RunCommand(int argc, char** argv, int first);
int SynthCommand(int argc, char** argv, int first);
int QuantizeCommand(int argc, char** argv, int first);
int BenchCommand(int argc, char** argv, int first);
int TokenizeCommand(int argc, char** argv, int first);
int DetokenizeCommand(int argc, char** argv, int first);
int ChatTemplateCommand(int argc, char** argv, int first);
int BatchCommand(int argc, char** argv, int first);
int ServeCommand(int argc, char** argv, int first);

}  // namespace ember::app
