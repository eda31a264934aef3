/** A real Telegraf bot behind intakeHandler, for the Python end-to-end tests (see common.ts). */

import { Telegraf, type Context } from "telegraf";
import { message } from "telegraf/filters";
import { intakeHandler, type IntakeFlavor } from "../../src/index";
import { handleText, listen, settings } from "./common";

const { token, apiRoot, port, options } = settings();
// Handlers may outlive Telegraf's 90 s handlerTimeout once deferred.
const bot = new Telegraf<Context & IntakeFlavor>(token, {
  telegram: { apiRoot },
  handlerTimeout: Infinity,
});
bot.on(message("text"), (ctx) =>
  handleText(ctx.message.text, ctx.update.update_id, ctx.intake, (text) =>
    ctx.telegram.sendMessage(ctx.chat.id, text),
  ),
);
listen(intakeHandler(bot, options), port);
