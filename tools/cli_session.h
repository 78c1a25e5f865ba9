/* cli_session.h - what the CLI does with session files (tools/cli_session.c):
 * recognise one, and print its header for `dsattn info FILE`. */
#ifndef DSATTN_CLI_SESSION_H
#define DSATTN_CLI_SESSION_H

/* 1 if the file starts with the session magic. */
int dsattn_cli_is_session(const char *path);
/* `dsattn info FILE` on a session: validate it whole and print its header;
 * exit status 0, or 1 with the library's message. */
int dsattn_cli_session_info(const char *path);

#endif
