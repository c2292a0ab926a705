/* dray-conformance: certify a plugin against the CPU reference without dray's
 * engine (the kit loads both plugins itself). Same options as `dray conformance`. */
#include "conformance.h"

int main(int argc, char **argv)
{
    return dray_conformance_main(argc, argv, "dray-conformance");
}
