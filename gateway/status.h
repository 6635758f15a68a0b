/* gradgate status: the status of a running gateway, asked over its
 * control socket and printed as tables or JSON. */
#ifndef GG_STATUS_H
#define GG_STATUS_H

/* argv[0] is "status"; returns the exit status (see its usage text). */
int gg_status_main(int argc, char **argv);

#endif
