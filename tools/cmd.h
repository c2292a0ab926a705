/* Subcommands of the dray command: each lives in its own tools/cmd_<name>.c (or
 * bench/) and takes (argc, argv) with argv[0] the subcommand's name. */
#ifndef DRAY_TOOLS_CMD_H
#define DRAY_TOOLS_CMD_H

int dray_cmd_run(int argc, char **argv);
int dray_cmd_chat(int argc, char **argv);
int dray_cmd_devices(int argc, char **argv);
int dray_cmd_conformance(int argc, char **argv);
int dray_cmd_bench(int argc, char **argv);
int dray_cmd_info(int argc, char **argv);
int dray_cmd_config(int argc, char **argv);
int dray_cmd_tokenize(int argc, char **argv);
int dray_cmd_perplexity(int argc, char **argv);
int dray_cmd_serve(int argc, char **argv);
int dray_cmd_plugin(int argc, char **argv);

#endif
