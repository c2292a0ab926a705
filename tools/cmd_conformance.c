/* dray conformance: the conformance kit's command line (plugins/conformance),
 * also built alone as dray-conformance for vendors who do not build the engine. */
#include "cmd.h"
#include "conformance.h"

int dray_cmd_conformance(int argc, char **argv)
{
    return dray_conformance_main(argc, argv, "dray conformance");
}
