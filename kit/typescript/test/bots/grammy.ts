/** A real grammY bot behind intakeHandler, for the Python end-to-end tests (see common.ts). */

import { Bot, type Context } from "grammy";
import { intakeHandler, type IntakeFlavor } from "../../src/index";
import { handleText, listen, settings } from "./common";

const { token, apiRoot, port, options } = settings();
// No botInfo: grammY initialises through getMe on the fake Bot API.
const bot = new Bot<Context & IntakeFlavor>(token, { client: { apiRoot } });
bot.on("message:text", (ctx) =>
  handleText(ctx.message.text, ctx.update.update_id, ctx.intake, (text) =>
    ctx.api.sendMessage(ctx.chat.id, text),
  ),
);
listen(intakeHandler(bot, options), port);
