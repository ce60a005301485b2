// An ACP agent installed without one of its packages (as `npm install` under a folder the
// jail hides leaves it): Node stops at the import, before a word of ACP, with
// ERR_MODULE_NOT_FOUND and a stack trace on stderr.
import { runAcp } from "@example/acp-agent-runtime-that-is-not-installed";

runAcp();
