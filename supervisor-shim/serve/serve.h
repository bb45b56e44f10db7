/*
 * sandbox-shim serve: the supervisor as an HTTP service (README.md, "Service
 * mode"), a drop-in for the upstream supervisor's /run API in host mode.
 */
#ifndef SB_SHIM_SERVE_H
#define SB_SHIM_SERVE_H

/**
 * Parses serve's flags and environment, starts the listener and runs until
 * SIGTERM or SIGINT, then drains the runs in flight.
 * @param argv argv[0] is "serve"
 * @return the process exit status: 0 after a clean stop, 2 for usage or configuration errors
 */
int sb_shim_serve_main(int argc, char **argv);

#endif
