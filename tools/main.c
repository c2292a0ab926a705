/* The dray command: one binary, one subcommand per job. Each subcommand lives in
 * its own cmd_<name>.c and has the signature int dray_cmd_<name>(argc, argv),
 * where argv[0] is the subcommand's name. Exit status: 0 ok, 1 failure, 2 usage. */
#include <stdio.h>
#include <string.h>

#include "dray/dray.h"
#include "cmd.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"run", dray_cmd_run, "generate a continuation of a prompt"},
    {"chat", dray_cmd_chat, "interactive multi-turn chat"},
    {"serve", dray_cmd_serve, "OpenAI-compatible HTTP server (chat, completions, metrics)"},
    {"devices", dray_cmd_devices, "list plugins, devices and capabilities (-v: op matrix)"},
    {"conformance", dray_cmd_conformance, "check a plugin's ops against the CPU reference"},
    {"plugin", dray_cmd_plugin, "vendor kit: `plugin new NAME [DIR]` writes a renamed plugin skeleton"},
    {"bench", dray_cmd_bench, "benchmarks: ops, model"},
    {"info", dray_cmd_info, "describe a GGUF file"},
    {"config", dray_cmd_config, "print the effective configuration"},
    {"tokenize", dray_cmd_tokenize, "tokenize stdin with a model's tokenizer (ids, pieces)"},
    {"perplexity", dray_cmd_perplexity, "perplexity of a text; KL divergence against a base (.kld)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dray <command> [options]   (dray <command> -h for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dray %s\n", dray_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dray: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
