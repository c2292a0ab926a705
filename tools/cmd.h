/* Subcommands of the dray command. Weak while the tree is being assembled: a
 * command whose file is not built is simply not listed. */
#ifndef DRAY_TOOLS_CMD_H
#define DRAY_TOOLS_CMD_H

#define DRAY_CMD __attribute__((weak))
DRAY_CMD int dray_cmd_run(int argc, char **argv);
DRAY_CMD int dray_cmd_chat(int argc, char **argv);
DRAY_CMD int dray_cmd_devices(int argc, char **argv);
DRAY_CMD int dray_cmd_conformance(int argc, char **argv);
DRAY_CMD int dray_cmd_bench(int argc, char **argv);
DRAY_CMD int dray_cmd_info(int argc, char **argv);
DRAY_CMD int dray_cmd_config(int argc, char **argv);
DRAY_CMD int dray_cmd_tokenize(int argc, char **argv);

#endif
